"""The `partir` command line."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from partir.cli import MAX_SHOWN, main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "mlp"
BP_MP_Z3 = str(EXAMPLES / "bp_mp_z3.partir.py")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_table_lists_each_tactic(capsys):
    code, out, err = run(capsys, "partition", BP_MP_Z3)
    assert code == 0 and err == ""
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("#  tactic"))
    assert lines[header].split() == ["#", "tactic", "axis", "actions", "AG", "AR", "RS",
                                     "A2A", "CP", "conflicts", "sharded", "inputs", "time", "(ms)",
                                     "FLOP/dev", "est.", "step", "peak", "mem/dev"]
    rows = [line.split() for line in lines[header + 1:header + 4]]
    assert [row[:4] for row in rows] == [["1", "BP", "batch", "1"], ["2", "MP", "model", "1"],
                                         ["3", "Z3", "batch", "2"]]
    assert [" ".join(row[-9:-6]) for row in rows] == ["1 of 3", "3 of 3", "3 of 3"]
    # The simulator's estimates per device (cpu spec): BP over 4 devices computes a quarter
    # of the [256, 8] x [8, 16] and [256, 16] x [16, 8] matmuls and the relu,
    # (2 * 256 * 8 * 16 * 2 + 256 * 16) / 4 = 33792 FLOPs; MP halves that again.
    assert [row[-5] for row in rows] == ["33.8K", "16.9K", "16.9K"]
    assert all(row[-4].replace(".", "").isdigit() and row[-3] == "ms" for row in rows)
    assert all(row[-1] in ("B", "KiB", "MiB") for row in rows)
    assert "estimated per device on cpu" in out
    assert rows[0][9] == "none" and " ".join(rows[2][9:11]) == "2 axis_in_scope"
    # Then what each tactic did, with the inputs it left sharded.
    assert '[3] Z3: tile<%w1,0,"batch">; tile<%w2,1,"batch">; propagate' in lines
    z3 = out[out.index("[3] Z3"):]
    assert 'w1   [{"batch"}, {"model"}]' in z3 and 'w2   [{"model"}, {"batch"}]' in z3
    # MP's sum over "model" is still pending at the output (an all_reduce once lowered).
    assert 'out  [{"batch"}, {}] partial{"model"}' in z3
    # Its conflicts grouped as in the editor, with their count and what they mean.
    assert "    2 conflicts at 1 place: propagation stopped there" in z3
    assert ("    conflict in tactic 3 (Z3) at `dot_general` on axis 'batch', 2 times: the op "
            "is already inside a loop over this axis [model.py:17]") in z3
    # under it, as the editor's related information and message: the first occurrence
    # (what met), and what the conflict costs with the usual fix
    assert ("      on axis 'batch': loop 'batch' [#tile<0>] vs operand 1 tiled #tile<0> (and 1 "
            "more)\n      Costs an all_gather where the op uses it") in z3


def test_core_ir_after_a_tactic(capsys):
    code, out, _ = run(capsys, "partition", BP_MP_Z3, "--ir", "core", "--after", "1")
    assert code == 0
    assert out.startswith("func @mlp(") and 'loop "batch"' in out and 'loop "model"' not in out
    _, last, _ = run(capsys, "partition", BP_MP_Z3, "--ir", "core")
    assert 'loop "model"' in last
    _, traced, _ = run(capsys, "partition", BP_MP_Z3, "--ir", "core", "--after", "0")
    assert "loop" not in traced


def test_after_out_of_range(capsys):
    code, out, err = run(capsys, "partition", BP_MP_Z3, "--ir", "core", "--after", "4")
    assert code == 2 and out == ""
    assert err == "partir: error: --after 4: the schedule has 3 tactics (0 is the traced " \
                  "program)\n"


def test_after_needs_ir_and_ir_is_a_known_level(capsys):
    for argv in (["--after", "1"], ["--ir", "mhlo"], ["--ir", "core", "--json"]):
        with pytest.raises(SystemExit) as e:
            main(["partition", BP_MP_Z3, *argv])
        assert e.value.code == 2
    assert "invalid choice: 'mhlo'" in capsys.readouterr().err


def test_json_records(capsys):
    code, out, _ = run(capsys, "partition", BP_MP_Z3, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["mesh"] == {"batch": 4, "model": 2} and data["function"] == "mlp"
    bp, mp, z3 = data["tactics"]
    assert [t["name"] for t in data["tactics"]] == ["BP", "MP", "Z3"]
    assert bp["actions"] == ['tile<%x,0,"batch">', "propagate"]
    assert z3["input_shardings"]["w2"] == '[{"model"}, {"batch"}]'
    assert mp["output_shardings"] == {"out": '[{"batch"}, {}] partial{"model"}'}
    assert z3["source"]["file"] == BP_MP_Z3 and z3["source"]["line"] == 17
    conflict = z3["conflicts"][0]
    assert conflict["kind"] == "axis_in_scope" and conflict["op"] == "dot_general"
    assert conflict["loc"]["file"].endswith("model.py") and conflict["loc"]["line"] > 0
    assert all(t["elapsed_s"] >= t["propagation_s"] >= 0 for t in data["tactics"])
    assert bp["cost"]["device"] == "cpu" and bp["cost"]["flops"] == 2 * mp["cost"]["flops"]
    assert mp["cost"]["bytes_moved"]["all_reduce"] > 0 == bp["cost"]["bytes_moved"]["all_reduce"]


def test_device_option_selects_the_spec(capsys):
    code, out, _ = run(capsys, "partition", BP_MP_Z3, "--json", "--device", "h100")
    assert code == 0
    assert {t["cost"]["device"] for t in json.loads(out)["tactics"]} == {"H100-80GB"}
    code, out, err = run(capsys, "partition", BP_MP_Z3, "--device", "tpu-v9")
    assert code == 2 and out == ""
    assert "unknown device 'tpu-v9'" in err and "H100-80GB" in err


def test_error_in_schedule_file_exits_2_with_file_and_line(capsys, tmp_path):
    path = tmp_path / "bad.partir.py"
    path.write_text("import partir\n\nmesh = {'batch': 4}\nschedule = [partir.Mesh(3)]\n")
    code, out, err = run(capsys, "partition", str(path))
    assert code == 2 and out == ""
    assert err.startswith(f"partir: error: {path}:4:")
    assert "PartitionError: a mesh needs at least one named axis" in err
    assert "Traceback" not in err


def test_error_in_a_tactic_exits_2_with_its_line(capsys, tmp_path):
    text = Path(BP_MP_Z3).read_text().replace('{"w1": 1}', '{"w3": 1}')
    path = tmp_path / "typo.partir.py"
    path.write_text(text)
    (tmp_path / "model.py").write_text((ROOT / "examples" / "mlp" / "model.py").read_text())
    code, _, err = run(capsys, "partition", str(path))
    assert code == 2
    assert err.startswith(f"partir: error: {path}:16: tactic 2 (MP): no input, output or tag "
                          f"named 'w3'")


@pytest.mark.slow
def test_console_script():
    script = Path(sys.executable).parent / "partir"
    assert script.exists()
    proc = subprocess.run([str(script), "partition", "examples/mlp/bp.partir.py"], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert '[1] BP: tile<%x,0,"batch">; propagate' in proc.stdout


def test_table_counts_collectives_per_tactic(capsys):
    assert main(["partition", str(EXAMPLES / "bp_mp_z3.partir.py")]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("#"))
    assert header.split()[4:8] == ["AG", "AR", "RS", "A2A"]
    rows = {line.split()[1]: line.split()[4:8] for line in lines if line[:1].isdigit()}
    assert rows == {"BP": ["0", "0", "0", "0"], "MP": ["0", "1", "0", "0"],
                    "Z3": ["2", "1", "0", "0"]}


def test_ir_hlo_of_the_es_schedule(capsys):
    assert main(["partition", str(EXAMPLES / "es.partir.py"), "--ir", "hlo"]) == 0
    out = capsys.readouterr().out
    assert "reduce_scatter" in out and 'all_gather [{}, {"model"}] %x' in out


def test_run_checks_and_times_the_partitioned_program(capsys):
    assert main(["run", str(EXAMPLES / "bp_mp_z3.partir.py"), "--steps", "3"]) == 0
    out, err = capsys.readouterr()
    assert "OK" in out and "step time" in out and "over 3 steps" in out
    assert "\r" not in out + err and err == ""  # no progress bar into a pipe or a log


def test_run_as_json_with_a_seed_and_without_the_check(capsys):
    argv = ["run", str(EXAMPLES / "bp_mp_z3.partir.py"), "--steps", "2", "--json"]
    assert main([*argv, "--seed", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["seed"] == 3 and report["steps"] == 2 and report["check_ok"] is True
    assert report["devices"] == 8 and report["mesh"] == {"batch": 4, "model": 2}
    assert report["max_abs_error"] < 1e-4 and report["step_time_min_s"] > 0
    assert report["collectives"]
    assert main([*argv, "--no-check"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "check_ok" not in report and "max_abs_error" not in report
    with pytest.raises(SystemExit):
        main([*argv, "--seed", "-1"])
    assert "must be >= 0" in capsys.readouterr().err


@pytest.mark.slow
def test_run_as_two_processes_equals_the_single_process_run(capsys):
    """`--processes 2`: two processes of 4 CPU devices under jax.distributed run the one
    8-device program; each checks the gathered result against the unpartitioned
    function, and the collectives are the single-process run's."""
    argv = ["run", str(EXAMPLES / "bp_mp_z3.partir.py"), "--steps", "1", "--json"]
    assert main(argv) == 0
    single = json.loads(capsys.readouterr().out)
    assert main([*argv, "--processes", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["processes"] == 2 and single["processes"] == 1
    assert report["devices"] == single["devices"] == 8
    assert report["check_ok"] is True and report["max_abs_error"] < 1e-4
    assert report["collectives"] == single["collectives"]
    assert main([*argv, "--processes", "3"]) == 2
    assert "cannot share 8 devices evenly" in capsys.readouterr().err


@pytest.mark.slow
def test_a_failing_process_of_a_run_ends_the_others_and_names_their_logs(capsys, tmp_path):
    bad = tmp_path / "bad.partir.py"
    bad.write_text("raise RuntimeError('broken schedule file')\n")
    assert main(["run", str(bad), "--processes", "2", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "exited with" in err and "logs of every process in" in err
    assert "broken schedule file" in err


def test_version_is_the_installed_packages(capsys):
    from importlib.metadata import version

    import partir

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"partir {version('partir')}\n"
    assert partir.__version__ == version("partir")


@pytest.mark.slow
def test_a_reader_that_stops_early_is_not_an_error():
    # `partir partition FILE --ir hlo | head -1`: the HLO text is far larger than a pipe.
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from partir.cli import main; sys.exit(main())",
         "partition", str(ROOT / "examples" / "transformer" / "bp_mp_z3.partir.py"),
         "--ir", "hlo"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout.readline().startswith(b"func @train_step(")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_collectives_are_listed_at_their_model_lines_with_loop_bodies_per_run(capsys):
    """The scan-over-layers transformer under BP+MP: each block's sum over "model" is in
    the scan's body, at the block's line, run once per layer (4 in model.TINY), and so
    is the sum over "batch" of each layer's weight gradients."""
    scan = str(ROOT / "examples" / "transformer" / "scan_bp_mp.partir.py")
    code, out, _ = run(capsys, "partition", scan)
    assert code == 0
    listed = out[out.index("collectives of the final program by model line:"):]
    assert ("model.py:79 (attention): all_reduce {batch} x1 (runs 4x per call); "
            "all_reduce {model} x1 (runs 4x per call)\n") in listed
    assert ("model.py:83 (mlp): all_reduce {batch} x3 (runs 12x per call); "
            "all_reduce {model} x2 (runs 8x per call)\n") in listed
    # outside the loops: the loss's sum over the batch, run once
    assert "model.py:109 (loss_fn): all_reduce {batch} x1\n" in listed


def test_collectives_moving_different_values_on_one_line_are_counted_together(capsys):
    # BP+MP+Z3 of the matmul chain: Z3 gathers both weights for the chain's line
    code, out, _ = run(capsys, "partition", BP_MP_Z3)
    assert code == 0
    listed = out[out.index("collectives of the final program by model line:"):]
    assert "model.py:17 (mlp): all_gather {batch} x2; all_reduce {model} x1" in listed


AUTO = '''\
from model import example_args, mlp

import partir

program = partir.Program(mlp, *example_args())
mesh = {"batch": 4, "model": 2}
schedule = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
    partir.AutomaticPartition(axis="model", name="Auto", max_evaluations=30),
]
'''


def _cli(*argv: str, cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c",
                           "import sys; from partir.cli import main; sys.exit(main())",
                           *argv], cwd=cwd, capture_output=True, text=True, timeout=300,
                          **kw)


@pytest.mark.slow
def test_progress_goes_to_stderr_as_lines_only_when_asked(tmp_path):
    (tmp_path / "model.py").write_text((EXAMPLES / "model.py").read_text())
    (tmp_path / "auto.partir.py").write_text(AUTO)
    quiet = _cli("partition", "auto.partir.py", "--ir", "spmd", cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    shown = _cli("partition", "auto.partir.py", "--ir", "spmd", "--progress", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout == quiet.stdout
    lines = shown.stderr.splitlines()
    assert "\r" not in shown.stderr
    assert lines[:3] == ["loading the schedule file", "loaded", "tracing"]
    assert "tactic 1/2: BP" in lines and "tactic 2/2: Auto" in lines
    # The search's evaluations, at most one line a second, of one search.
    searching = [line for line in lines if line.startswith("tactic 2/2: Auto: ")]
    assert searching and "evaluations" in searching[0]
    assert lines[-1] == "lowering to PartIR:SPMD"
    run = _cli("run", "auto.partir.py", "--steps", "2", "--progress", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "partitioning (2 tactics) and compiling" in run.stderr
    assert "step 1/2" in run.stderr and "\r" not in run.stderr + run.stdout


@pytest.mark.slow
def test_progress_on_a_terminal_is_one_line_rewritten_and_cleared(tmp_path):
    import pty
    parent, child = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-c",
                               "import sys; from partir.cli import main; sys.exit(main())",
                               "partition", str(Path(BP_MP_Z3).name)], cwd=EXAMPLES,
                              stdout=subprocess.PIPE, stderr=child, timeout=300)
        os.close(child)
        child = -1
        err = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(parent, 65536):
                err += chunk
    finally:
        os.close(parent)
        if child >= 0:
            os.close(child)
    assert proc.returncode == 0
    assert b"\r\x1b[Ktactic 3/3: Z3" in err and err.endswith(b"\r\x1b[K")
    assert b"\r" not in proc.stdout


def test_conflicts_are_grouped_as_in_the_editor(capsys):
    # The transformer's layers repeat each conflict on one model line: the report says
    # each place once, with how many conflicts it holds.
    schedule = str(ROOT / "examples" / "transformer" / "bp_mp_z3.partir.py")
    code, out, _ = run(capsys, "partition", schedule, "--json")
    assert code == 0
    tactics = json.loads(out)["tactics"]
    code, out, _ = run(capsys, "partition", schedule)
    for i, t in enumerate(tactics, 1):
        places = {(c["kind"], c["op"], c["loc"]["line"]) for c in t["conflicts"]}
        section = out[out.index(f"[{i}] {t['name']}:"):].split("\n\n")[0]
        listed = [line for line in section.splitlines()
                  if line.startswith(f"    conflict in tactic {i} ")]
        assert len(listed) == min(len(places), MAX_SHOWN)
        if places:
            n = len(t["conflicts"])
            assert f"    {n} conflict{'s' if n > 1 else ''} at {len(places)} place" in section
    # Many conflicts made a few lines.
    assert any(len(t["conflicts"]) > 2 * len({(c["kind"], c["op"], c["loc"]["line"])
                                              for c in t["conflicts"]}) for t in tactics)
