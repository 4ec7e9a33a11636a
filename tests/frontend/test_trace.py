from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from partir.core.interpreter import interpret
from partir.frontend import trace
from partir.ir.opnames import CONSTANT

S = jax.ShapeDtypeStruct


def test_names_from_parameters_and_pytree_paths():
    def f(params, opt_state, batch):
        return params["layers"][0]["w"].sum() + opt_state[0].mu.sum() + batch.sum()

    from collections import namedtuple
    State = namedtuple("State", ["mu", "nu"])
    params = {"layers": [{"w": S((2, 2), jnp.float32)}]}
    prog = trace(f, params, (State(S((2,), jnp.float32), S((2,), jnp.float32)),),
                 S((3,), jnp.float32))
    assert prog.input_names == ["params/layers/0/w", "opt_state/0/mu", "opt_state/0/nu",
                                "batch"]
    assert [a.name for a in prog.function.args] == prog.input_names
    assert prog.output_names == ["out"]


def test_outputs_are_named_by_pytree_path_under_out():
    def f(x, w):
        return x.sum(), {"w": w * 2, "b": (x, w)}

    prog = trace(f, S((2,), jnp.float32), S((3,), jnp.float32))
    assert prog.output_names == ["out/0", "out/1/b/0", "out/1/b/1", "out/1/w"]
    assert prog.function.result_names == prog.output_names


def test_the_output_root_never_clashes_with_an_input_or_a_tag():
    # A parameter named `out`: the outputs are named under "out_", as the VJP's cotangent
    # is named past a parameter `cotangent`.
    def f(out, out_):
        return out * 2, out_

    prog = trace(f, S((2,), jnp.float32), S((2,), jnp.float32))
    assert prog.input_names == ["out", "out_"]
    assert prog.output_names == ["out__/0", "out__/1"]

    def g(x):
        return partir.tag(x * 2, "out/h")

    assert trace(g, S((2,), jnp.float32)).output_names == ["out_"]


def test_static_argnums_are_not_inputs():
    def f(x, n):
        return x * n

    prog = trace(f, S((2,), jnp.float32), 3, static_argnums=(1,))
    assert prog.input_names == ["x"]


def _line_of(fn, text):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def test_calls_are_inlined_and_constants_kept():
    @jax.custom_vjp
    def g(x):
        return x * 2

    g.defvjp(lambda x: (x * 2, None), lambda r, t: (t * 2,))

    @jax.custom_jvp
    def h(x):
        return jnp.sin(x)

    h.defjvp(lambda p, t: (jnp.sin(p[0]), t[0]))
    table = np.arange(6, dtype=np.float32)

    @jax.jit
    def inner(x):
        return jax.checkpoint(jnp.cos)(x) + table

    def f(x):
        return g(h(inner(x))).sum()

    x = np.linspace(0, 1, 6, dtype=np.float32)
    for fn in (f, jax.grad(f)):
        prog = trace(fn, x)
        names = {op.name for op in prog.function.ops}
        assert not names & {"jit", "pjit", "custom_jvp_call", "custom_vjp_call", "remat2",
                            "checkpoint"}
        assert CONSTANT in names
        np.testing.assert_allclose(interpret(prog.function, x)[0], fn(x), rtol=1e-6)


def test_every_op_points_at_the_user_line_also_after_autodiff():
    def model(x, w):
        h = jnp.tanh(x @ w)
        return jnp.sum(h * h)

    prog = trace(jax.grad(model, argnums=1), S((4, 3), jnp.float32), S((3, 2), jnp.float32))
    lines = {_line_of(model, "jnp.tanh"), _line_of(model, "jnp.sum")}
    for op in prog.function.ops:
        if op.name == CONSTANT:
            continue
        assert op.loc.file == __file__, op
        assert op.loc.line in lines, op
    dots = [op for op in prog.function.ops if op.name == "dot_general"]
    assert len(dots) == 2 and all(op.loc.line == _line_of(model, "jnp.tanh") for op in dots)


def test_tag_survives_grad_and_names_the_value():
    def f(x):
        return jnp.sum(partir.tag(jnp.sin(x), "act") ** 2)

    prog = trace(jax.grad(f), S((4,), jnp.float32))
    assert list(prog.tags) == ["act"]
    x = np.ones(4, np.float32)
    np.testing.assert_allclose(jax.jit(jax.grad(f))(x), jax.grad(f)(x))


def test_tag_rejects_bad_names():
    with pytest.raises(TypeError):
        partir.tag(jnp.ones(2), "")


def test_untraceable_function_is_a_partition_error():
    def f(x):
        return x @ x  # shapes do not match

    with pytest.raises(partir.TracingError) as e:
        trace(f, S((2, 3), jnp.float32))
    assert "'f'" in str(e.value)
    assert e.value.loc.file == __file__ and e.value.loc.line == _line_of(f, "x @ x")
    assert f"test_trace.py:{e.value.loc.line}" in str(e.value)


def test_two_copies_of_a_module_give_their_own_file_as_locations(tmp_path):
    """The same source in two files compiles to equal code objects (Python does not
    compare their file names): each copy's equations are still located in its own file."""
    import importlib.util

    source = "import jax.numpy as jnp\n\n\ndef f(x):\n    return jnp.sin(x) * 2.0\n"
    locations = []
    for name in ("a", "b"):
        path = tmp_path / name / "model.py"
        path.parent.mkdir()
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(f"copy_{name}.model", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        traced = trace(module.f, np.ones(3, np.float32))
        locations.append({op.loc.file for op in traced.function.ops if op.loc.line})
    assert locations == [{str(tmp_path / "a" / "model.py")},
                         {str(tmp_path / "b" / "model.py")}]


def test_a_loop_keeps_its_bodies_as_regions_and_a_number_only_its_own_bodies_share():
    """The op holds no jaxpr; a layer's loop called twice shares its number (its
    signature, and so propagation's decisions), a loop with another body, in this trace
    or another, does not."""
    from partir.frontend.jaxpr_to_ir import BODIES_KEY

    def step(c, _):
        return jnp.sin(c), None

    def layer(x):  # one body function: JAX traces it once for both calls
        return jax.lax.scan(step, x, None, length=2)[0]

    def other(x):
        return jax.lax.scan(lambda c, _: (jnp.cos(c), None), x, None, length=2)[0]

    x = S((4,), jnp.float32)
    loops = [op for op in trace(lambda x: layer(layer(x)), x).function.ops if op.regions]
    assert len(loops) == 2 and not any("jaxpr" in op.params for op in loops)
    assert loops[0].params[BODIES_KEY] == loops[1].params[BODIES_KEY]
    (elsewhere,) = [op for op in trace(other, x).function.ops if op.regions]
    assert elsewhere.params[BODIES_KEY] != loops[0].params[BODIES_KEY]
