"""The last watch over a job's processes: started by the job runner, it ends every process
carrying the job's id once the runner is gone.

The runner dies with the daemon (SIGKILL, `processes.die_with_parent`) and so cannot end
the processes the user's code started; this small process gets SIGTERM when the runner
dies (`prctl(PR_SET_PDEATHSIG)`) and then SIGKILLs every process whose environment holds
the job's `PARTIR_JOB_ID` (those that called `setsid` too), so nothing of a job outlives
its runner however the runner ended.

    python -P -m partir_daemon.reaper JOB_ID RUNNER_PID
"""

from __future__ import annotations

import os
import signal
import sys

from partir_daemon.processes import carrying, set_parent_death_signal, signal_all


def main(argv: list[str]) -> int:
    job_id, runner = argv[0], int(argv[1])

    def end(*_: object) -> None:
        signal_all(carrying(job_id), signal.SIGKILL)
        os._exit(0)

    signal.signal(signal.SIGTERM, end)
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != runner:  # the runner died before the call above
        end()
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
