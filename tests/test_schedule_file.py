"""Schedule files: loading the examples, errors at the right line, unsaved text, ranges."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import partir
from partir.schedule_file import (
    MODULE_NAME,
    ScheduleExecutionError,
    ScheduleFileError,
    ScheduleMissingError,
    ScheduleSyntaxError,
    ScheduleTypeError,
    SourceRange,
    load_schedule_file,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "mlp"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.partir.py"))

# A model module next to the schedule files the tests write.
MODEL = """\
import jax
import jax.numpy as jnp

def f(x, w):
    return jnp.tanh(x @ w)

def args():
    return (jax.ShapeDtypeStruct((16, 8), jnp.float32),
            jax.ShapeDtypeStruct((8, 4), jnp.float32))

def broken():
    return (1, 2)[5]
"""

GOOD = """\
import partir
from tmodel import args, f

program = partir.Program(f, *args())
mesh = {"batch": 4, "model": 2}
schedule = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
    partir.ManualPartition({"w": 1}, axis="model", name="MP"),
]
"""


def write(tmp_path: Path, text: str, name: str = "s.partir.py") -> Path:
    (tmp_path / "tmodel.py").write_text(MODEL)
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load_error(tmp_path: Path, text: str) -> ScheduleFileError:
    path = write(tmp_path, text)
    with pytest.raises(ScheduleFileError) as e:
        load_schedule_file(path)
    assert e.value.file == str(path)
    assert str(e.value).startswith(f"{path}:{e.value.line}:")
    assert isinstance(e.value, partir.PartitionError)
    return e.value


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_example_files_exist():
    assert [p.name for p in EXAMPLE_FILES] == ["bp.partir.py", "bp_mp.partir.py",
                                               "bp_mp_z3.partir.py", "es.partir.py"]


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_files_load_and_partition_correctly(path):
    sf = load_schedule_file(path)
    assert sf.mesh == partir.Mesh({"batch": 4, "model": 2})
    assert all(isinstance(t, partir.ManualPartition) for t in sf.schedule)
    assert [t.name for t in sf.schedule] == ["BP", "MP", "Z3", "ES"][:len(sf.schedule)]
    assert [set(t.inputs) for t in sf.tactics] == [set(t.inputs) for t in sf.schedule]
    result = sf.program.core_partition(sf.mesh, sf.schedule)
    # The sequential interpreter after the last tactic equals the model on the example.
    model = sys.modules["model"]
    got = result.interpret(*sf.program.args)
    np.testing.assert_allclose(got, model.mlp(*sf.program.args), rtol=1e-5, atol=1e-5)


def test_es_shards_input_and_output_activation_on_model_axis():
    sf = load_schedule_file(EXAMPLES / "es.partir.py")
    result = sf.program.core_partition(sf.mesh, sf.schedule)
    es = result.tactics[-1]
    assert es.actions == ['tile<%x,1,"model">', 'tile<%y,1,"model">', "propagate"]
    assert str(es.program.input_shardings()["x"]) == '[{"batch"}, {"model"}]'
    assert str(es.program.output_shardings()["out"]) == '[{"batch"}, {"model"}]'


def test_loading_restores_sys_path_and_keeps_only_imported_modules(tmp_path):
    path = write(tmp_path, GOOD)
    sys.modules.pop("tmodel", None)
    path_before, modules_before = list(sys.path), set(sys.modules)
    load_schedule_file(path)
    assert sys.path == path_before
    assert set(sys.modules) - modules_before == {"tmodel"}
    assert MODULE_NAME not in sys.modules


def test_failed_load_restores_sys_path(tmp_path):
    path = write(tmp_path, "import sys\nsys.path.append('elsewhere')\n1 / 0\n")
    before = list(sys.path)
    with pytest.raises(ScheduleExecutionError):
        load_schedule_file(path)
    assert sys.path == before and MODULE_NAME not in sys.modules


def test_same_named_model_modules_in_two_directories(tmp_path):
    # Each schedule file gets the `tmodel` next to it, and edits to it are seen.
    for name, size in (("a", 16), ("b", 32)):
        (tmp_path / name).mkdir()
        write(tmp_path / name, GOOD)
        (tmp_path / name / "tmodel.py").write_text(MODEL.replace("(16, 8)", f"({size}, 8)"))

    def shape(directory):
        return load_schedule_file(tmp_path / directory / "s.partir.py").program.args[0].shape

    assert shape("a") == (16, 8) and shape("b") == (32, 8)
    # A different length: Python's bytecode cache trusts a source file whose size and
    # mtime in whole seconds are unchanged.
    (tmp_path / "a" / "tmodel.py").write_text(MODEL.replace("(16, 8)", "(128, 8)"))
    assert shape("a") == (128, 8)


def test_unsaved_text_overrides_the_file(tmp_path):
    path = write(tmp_path, GOOD)
    sf = load_schedule_file(path, text=GOOD.replace('name="BP"', 'name="unsaved"'))
    assert sf.schedule[0].name == "unsaved" and sf.path == str(path)
    # The file itself may be broken or missing: only the text counts.
    path.write_text("this is not python (")
    assert load_schedule_file(path, text=GOOD).schedule[0].name == "BP"
    missing = tmp_path / "new.partir.py"
    assert load_schedule_file(missing, text=GOOD).schedule[1].name == "MP"
    # Errors in unsaved text are at its lines, and tactics record them.
    text = GOOD.replace("mesh =", "\n\nmesh =")
    sf = load_schedule_file(path, text=text)
    assert sf.schedule[0].loc.line == line_of(text, '"BP"') == sf.tactics[0].span.line


def test_ranges_of_tactics_inputs_and_assignments(tmp_path):
    text = textwrap.dedent("""\
        import partir
        from tmodel import args, f

        program = partir.Program(
            f, *args())
        mesh = partir.Mesh({"batch": 4, "model": 2})
        MP = partir.ManualPartition({"w": 1}, axis="model", name="MP")
        schedule = [
            partir.ManualPartition({"x": 0,
                                    "w": partir.REPLICATED}, axis="batch", name="BP"),
            MP,
            partir.ManualPartition(axis="model", inputs={"x": partir.UNKNOWN}),
        ]
        """)
    sf = load_schedule_file(write(tmp_path, text))
    assert sf.program_span == SourceRange(4, 0, 5, 15)
    assert sf.mesh_span == SourceRange(6, 0, 6, 44)
    assert sf.schedule_span == SourceRange(8, 0, 13, 1)
    bp, mp, third = sf.tactics
    assert bp.span.line == 9 and bp.span.end_line == 10
    assert snippet(text, bp.span).startswith('partir.ManualPartition({"x": 0,\n')
    assert snippet(text, bp.span).endswith('axis="batch", name="BP")')
    assert {k: (r.line, snippet(text, r)) for k, r in bp.inputs.items()} == {
        "x": (9, '"x"'), "w": (10, '"w"')}
    # A name in the list: the element is the name, the keys are where it is assigned.
    assert mp.span == SourceRange(11, 4, 11, 6)
    assert mp.inputs == {"w": SourceRange(7, 29, 7, 32)}
    assert third.span.line == 12 and snippet(text, third.inputs["x"]) == '"x"'


def snippet(text: str, r: SourceRange) -> str:
    lines = text.splitlines()
    if r.line == r.end_line:
        return lines[r.line - 1][r.col:r.end_col]
    return "\n".join([lines[r.line - 1][r.col:], *lines[r.line:r.end_line - 1],
                      lines[r.end_line - 1][:r.end_col]])


def test_ranges_count_characters_not_bytes(tmp_path):
    text = GOOD.replace('({"x": 0}', '({"é": partir.UNKNOWN, "x": 0}')
    sf = load_schedule_file(write(tmp_path, text))
    assert {k: snippet(text, r) for k, r in sf.tactics[0].inputs.items()} == {
        "é": '"é"', "x": '"x"'}


def test_schedule_not_a_literal_has_no_element_ranges(tmp_path):
    text = GOOD + "schedule = schedule[:1] + schedule[1:]\n"
    sf = load_schedule_file(write(tmp_path, text))
    assert [t.span for t in sf.tactics] == [None, None]
    assert sf.schedule_span.line == 10  # the last assignment


def test_syntax_error_line_and_column(tmp_path):
    e = load_error(tmp_path, """\
        import partir

        mesh = {"batch": 4,
                "model" 2}
        """)
    assert isinstance(e, ScheduleSyntaxError)
    assert e.line == 4 and "':' expected after dictionary key" in e.message


def test_compile_time_syntax_error(tmp_path):
    e = load_error(tmp_path, "import partir\n\n\nreturn 3\n")
    assert isinstance(e, ScheduleSyntaxError) and e.line == 4
    assert "'return' outside function" in e.message


def test_exception_while_executing(tmp_path):
    e = load_error(tmp_path, """\
        import partir

        sizes = {"batch": 4}
        mesh = {"batch": sizes["batch"],
                "model": sizes["model"]}
        """)
    assert isinstance(e, ScheduleExecutionError)
    assert e.line == 5 and e.exc_type == "KeyError" and e.inner is None
    assert "KeyError: 'model'" in str(e)
    assert e.span == SourceRange(5, 17, 5, 31)  # the failing expression: sizes["model"]


def test_exception_in_imported_module_reports_the_line_here(tmp_path):
    e = load_error(tmp_path, """\
        import partir
        import tmodel

        program = partir.Program(tmodel.f, *tmodel.args())
        values = tmodel.broken()
        """)
    assert isinstance(e, ScheduleExecutionError) and e.line == 5
    assert e.exc_type == "IndexError"
    assert e.inner.file == str(tmp_path / "tmodel.py") and e.inner.line == 12
    assert "tmodel.py:12, in broken" in str(e)


def test_import_error_of_a_broken_user_module(tmp_path):
    path = write(tmp_path, "import partir\nimport tbroken\n")
    (tmp_path / "tbroken.py").write_text("def f(:\n")
    with pytest.raises(ScheduleExecutionError) as e:
        load_schedule_file(path)
    assert e.value.line == 2 and e.value.exc_type == "SyntaxError"
    assert e.value.inner.file == str(tmp_path / "tbroken.py") and e.value.inner.line == 1


def test_bad_tactic_is_reported_at_its_line(tmp_path):
    e = load_error(tmp_path, GOOD.replace('{"w": 1}', '{"w": "1"}'))
    assert isinstance(e, ScheduleExecutionError) and e.line == 8
    assert e.exc_type == "InvalidTacticError" and "tactic MP: input 'w'" in str(e)


def test_system_exit_is_an_error_not_an_exit(tmp_path):
    e = load_error(tmp_path, "import sys\n\nsys.exit(3)\n")
    assert isinstance(e, ScheduleExecutionError) and e.line == 3 and e.exc_type == "SystemExit"


def test_main_block_does_not_run(tmp_path):
    sf = load_schedule_file(write(tmp_path, GOOD + "if __name__ == '__main__':\n    1 / 0\n"))
    assert len(sf.schedule) == 2


def test_missing_definitions_say_which_and_what(tmp_path):
    e = load_error(tmp_path, GOOD.replace("schedule = [", "schedul = ["))
    assert isinstance(e, ScheduleMissingError) and e.missing == ["schedule"] and e.line == 1
    assert "does not define `schedule`" in str(e) and "schedul` a misspelling" in str(e)
    e = load_error(tmp_path, "import partir\n")
    assert e.missing == ["program", "mesh", "schedule"]
    assert "partir.Program(fn, *example_args)" in str(e) and "partir.ManualPartition" in str(e)


def test_program_of_wrong_type(tmp_path):
    e = load_error(tmp_path, GOOD.replace("program = partir.Program(f, *args())", "program = f"))
    assert isinstance(e, ScheduleTypeError) and e.line == 4
    assert "`program` must be a partir.Program, got function" in str(e)
    assert "partir.Program(fn, *example_args)" in str(e)


def test_bad_mesh(tmp_path):
    e = load_error(tmp_path, GOOD.replace('"model": 2}', '"model": 0}'))
    assert isinstance(e, ScheduleTypeError) and e.line == 5
    assert "`mesh` is not a valid mesh" in str(e) and "'model'" in str(e)


def test_schedule_not_a_list(tmp_path):
    text = GOOD + "schedule = {'BP': schedule[0]}\n"
    e = load_error(tmp_path, text)
    assert isinstance(e, ScheduleTypeError) and e.line == 10
    assert "`schedule` must be a list of tactics" in str(e) and "got dict" in str(e)


def test_schedule_element_not_a_tactic(tmp_path):
    e = load_error(tmp_path, GOOD.replace('partir.ManualPartition({"w": 1}, axis="model", '
                                          'name="MP")', '{"w": 1}'))
    assert isinstance(e, ScheduleTypeError) and e.line == 8 and e.span.col == 4
    assert "`schedule[1]` must be a tactic such as partir.ManualPartition, got dict" in str(e)


def test_unreadable_file(tmp_path):
    with pytest.raises(ScheduleFileError) as e:
        load_schedule_file(tmp_path / "nope.partir.py")
    assert e.value.line == 0 and "cannot read the schedule file" in str(e.value)


def test_program_keeps_static_argnums_and_shape_structs():
    import jax
    import jax.numpy as jnp

    def f(x, n):
        return x * n

    program = partir.Program(f, jax.ShapeDtypeStruct((8,), jnp.float32), 3, static_argnums=(1,))
    result = program.core_partition({"batch": 4},
                                    [partir.ManualPartition({"x": 0}, axis="batch")])
    assert result.traced.input_names == ["x"]
    with pytest.raises(partir.PartitionError, match="function to partition"):
        partir.Program(3)


def test_one_tactic_without_a_list_is_a_schedule(tmp_path):
    # As `partir.jit(fn, mesh, partir.ManualPartition(...))` takes it.
    text = GOOD + 'schedule = partir.ManualPartition({"x": 0}, axis="batch", name="BP")\n'
    sf = load_schedule_file(write(tmp_path, text))
    (tactic,) = sf.schedule
    assert isinstance(tactic, partir.ManualPartition) and tactic.name == "BP"
    (source,) = sf.tactics
    assert source.span.line == text.count("\n") and source.span.col == 11
    assert list(source.inputs) == ["x"]
    assert len(sf.program.core_partition(sf.mesh, sf.schedule).tactics) == 1
