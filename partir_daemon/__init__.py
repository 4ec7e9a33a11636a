"""The partir compiler daemon: a long-running process per workspace that keeps traced
programs and per-tactic results cached, re-applies only the tactics after an edit of a
schedule file, and runs partitioned jobs on the local devices (DESIGN §6).

    partir_daemon.protocol   typed request/response dataclasses, JSON-RPC 2.0 framing
    partir_daemon.client     DaemonClient: connect (or start) a workspace's daemon, one
                             method per request
    partir_daemon.server     the daemon process (socket, status file, dispatch, watcher)
    partir_daemon.worker     the compiler child process (schedule files, caches, metadata)
    partir_daemon.jobs       job records under <workspace>/.partir/jobs/ and their processes
"""

__version__ = "0.1.0"
