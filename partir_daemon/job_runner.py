"""A job: run the partitioned program of a schedule file for N steps on the local
devices, in a process of its own (started by `partir_daemon.jobs`).

    python -m partir_daemon.job_runner --path FILE --steps N [--inputs example|random|F.npz]
                                       [--seed S] [--no-check]
                                       [--processes N --devices D --log-dir DIR]

The daemon sets `XLA_FLAGS=--xla_force_host_platform_device_count=<mesh size>` (used when
there is no accelerator) and `PARTIR_JOB_ID`. Events go to the daemon as JSON lines on a
private duplicate of stdout: {"event": "started" | "compiled" | "step" | "result" |
"error", ...}; everything the user's code prints goes to the job's log (stderr). The
process never outlives the daemon: it gets SIGKILL when the daemon dies (the daemon
starts it with `processes.die_with_parent`), and exits when its stdin closes; its
`partir_daemon.reaper` then ends the processes the user's code started.

With `--processes N` it launches N runners of one run under `jax.distributed`
(`partir.launch`), sharing the D devices; each logs to DIR/p<i>.err, and process 0's
events (DIR/p0.out) are passed on as its own, followed by a "processes" event with each
process's exit and log. The runners carry the job's id, so cancelling the job ends them
all; only the launcher has a reaper (a runner's would end the others when it exits).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, BinaryIO

from partir import launch
from partir_daemon import protocol as P
from partir_daemon.processes import JOB_ID_VARIABLE


def _watch_parent() -> None:
    def watch() -> None:
        while sys.stdin.buffer.read(1 << 16):
            pass
        os._exit(70)  # the daemon closed our stdin: it is gone

    threading.Thread(target=watch, name="job-parent-watch", daemon=True).start()


def _start_reaper() -> None:
    """The process that ends the job's other processes when this one dies, whatever
    kills it (`partir_daemon.reaper`)."""
    job_id = os.environ.get(JOB_ID_VARIABLE)
    if job_id:
        subprocess.Popen([sys.executable, "-P", "-m", "partir_daemon.reaper", job_id,
                          str(os.getpid())], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         close_fds=True)


def _inputs(program: Any, how: str, seed: int) -> tuple[Any, ...]:
    import jax
    import numpy as np

    from partir.frontend.names import leaf_names, parameter_names

    rng = np.random.default_rng(seed)

    def random_like(x: Any) -> Any:
        shape, dtype = np.shape(x), np.dtype(x.dtype)
        if np.issubdtype(dtype, np.integer):
            # Small non-negative integers: valid indices (token ids, labels) in any model.
            return rng.integers(0, 2, size=shape).astype(dtype)
        if dtype == np.bool_:
            return rng.integers(0, 2, size=shape).astype(bool)
        return rng.normal(size=shape).astype(dtype)

    args = program.args
    static = set(program.static_argnums)
    if how == "example":
        return tuple(a if i in static else jax.tree.map(
            lambda x: random_like(x) if isinstance(x, jax.ShapeDtypeStruct) else x, a)
            for i, a in enumerate(args))
    if how == "random":
        return tuple(a if i in static else jax.tree.map(random_like, a)
                     for i, a in enumerate(args))
    data = np.load(how)
    names = parameter_names(program.fn, len(args))
    out = []
    for i, (a, name) in enumerate(zip(args, names, strict=True)):
        if i in static:
            out.append(a)
            continue
        _leaves, tree = jax.tree_util.tree_flatten(a)
        keys = leaf_names(a, name)
        missing = [k for k in keys if k not in data]
        if missing:
            raise ValueError(f"{how} has no array for input(s) {missing[:5]}")
        out.append(jax.tree_util.tree_unflatten(tree, [data[k] for k in keys]))
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="partir_daemon.job_runner")
    parser.add_argument("--path", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--inputs", default="example")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--devices", type=int, default=launch.LOCAL_DEVICES)
    parser.add_argument("--log-dir")
    args = parser.parse_args(argv)
    # The schedule file's directory, after the standard library (started with -P: see
    # `client.module_command`).
    directory = os.path.dirname(os.path.abspath(args.path))
    if directory not in sys.path:
        sys.path.append(directory)
    out = P.child_stream()
    _watch_parent()
    place = launch.current()
    if place is None:
        _start_reaper()
    if args.processes > 1 and place is None:
        return _launch(args, out)
    if place is not None:
        launch.initialize(place)  # before JAX starts its backend

    def emit(event: str, **data: Any) -> None:
        out.write(P.encode({"event": event, **data}))

    try:
        import jax
        import numpy as np

        import partir
        from partir.cli import compare_with_unpartitioned
        from partir.schedule_file import load_schedule_file

        start = time.perf_counter()
        sf = load_schedule_file(args.path)
        devices = jax.devices()
        emit("started", platform=devices[0].platform, devices=len(devices))
        print(f"job {os.environ.get('PARTIR_JOB_ID', '?')}: {args.path} on {len(devices)} "
              f"{devices[0].platform} devices, mesh {sf.mesh}", flush=True)
        program = sf.program
        inputs = _inputs(program, args.inputs, args.seed)
        fn, meta = partir.jit(program.fn, sf.mesh, sf.schedule,
                              static_argnums=program.static_argnums)
        result = jax.block_until_ready(fn(*inputs))
        compile_s = time.perf_counter() - start
        emit("compiled", compile_s=compile_s, collectives=meta.collectives)
        print(f"partitioned and compiled in {compile_s:.2f} s; collectives "
              f"{meta.collectives}", flush=True)
        peak = None
        local = jax.local_devices()[0]  # of this process (all of them but under --processes)
        stats = local.memory_stats() if hasattr(local, "memory_stats") else None
        if stats and "peak_bytes_in_use" in stats:
            peak = int(stats["peak_bytes_in_use"])
        else:
            analysis = fn.lower(*inputs).compile().memory_analysis()
            if analysis is not None:
                peak = int(analysis.temp_size_in_bytes + analysis.argument_size_in_bytes +
                           analysis.output_size_in_bytes - analysis.alias_size_in_bytes)
        worst = ok = None
        if not args.no_check:
            worst, ok = compare_with_unpartitioned(program, inputs, result)
            print(f"check against the unpartitioned function: max |error| {worst:.2e} "
                  f"{'OK' if ok else 'MISMATCH'}", flush=True)
        times = []
        for step in range(args.steps):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*inputs))
            times.append(time.perf_counter() - t0)
            emit("step", step=step + 1, total=args.steps, time_s=times[-1])
        median = float(np.median(times)) if times else None
        if times:
            print(f"step time: median {median * 1e3:.3f} ms, min {min(times) * 1e3:.3f} ms "
                  f"over {len(times)} steps", flush=True)
        emit("result", metrics={
            "platform": devices[0].platform, "devices": len(devices), "steps": len(times),
            "compile_s": compile_s, "step_time_median_s": median,
            "step_time_min_s": min(times) if times else None, "peak_memory_bytes": peak,
            "max_abs_error": worst, "check_ok": ok, "collectives": meta.collectives,
            "processes": jax.process_count()})
        return 0 if ok is not False else 1
    except Exception as e:
        traceback.print_exc()
        emit("error", message=f"{type(e).__name__}: {e}")
        return 1


def _launch(args: argparse.Namespace, out: BinaryIO) -> int:
    """The job as `args.processes` runners of one run (see the module's docstring)."""
    log_dir = Path(args.log_dir)
    command = [sys.executable, "-P", "-m", "partir_daemon.job_runner", "--path", args.path,
               "--steps", str(args.steps), "--inputs", args.inputs, "--seed", str(args.seed),
               *(["--no-check"] if args.no_check else [])]
    events = log_dir / "p0.out"
    passed = 0

    def pass_on() -> None:
        nonlocal passed
        try:
            with events.open("rb") as f:
                f.seek(passed)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1  # whole lines only
        if end:
            out.write(data[:end])
            passed += end

    try:
        finished = launch.launch(command, args.processes, log_dir, devices=args.devices,
                                 tick=pass_on)
    except ValueError as e:
        out.write(P.encode({"event": "error", "message": str(e)}))
        return 1
    pass_on()
    out.write(P.encode({"event": "processes", "processes": [
        {"process": f.process_id, "exit_code": f.returncode, "log_path": str(f.stderr)}
        for f in finished]}))
    for f in finished:
        print(f"--- process {f.process_id} of {args.processes}: exit {f.returncode}, "
              f"log {f.stderr} ---\n{f.stderr.read_text(errors='replace')}", flush=True)
    return 0 if all(f.returncode == 0 for f in finished) else 1


if __name__ == "__main__":
    status = main()
    sys.stderr.flush()
    # Not sys.exit: the thread blocked reading stdin would abort interpreter shutdown.
    os._exit(status)
