"""Every primitive `jax.numpy`, `jax.nn`, `jax.lax` and `jax.random` emit has a rule, or is
listed in partir.rules.unsupported with the reason users are shown; every primitive JAX
registers is accounted for, so a new JAX primitive fails here until it is placed."""

from __future__ import annotations

import functools
import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend import core as jcore

import partir
from partir.frontend import tag_p
from partir.frontend.jaxpr_to_ir import INLINED_CALLS as CALLS
from partir.rules import CATALOGUE
from partir.rules.catalogue import OWN_NAMES, jax_primitive_names
from partir.rules.elementwise import ANNOTATIONS
from partir.rules.unsupported import NOT_EMITTED, UNSUPPORTED, why_unsupported

MODULES = {"jnp": jnp, "jnp.linalg": jnp.linalg, "jnp.fft": jnp.fft, "nn": jax.nn,
           "nn.initializers": jax.nn.initializers, "lax": lax, "lax.linalg": lax.linalg,
           "random": jax.random}


def _primitives(jaxpr, out: dict[str, str], where: str) -> None:
    for eqn in jaxpr.eqns:
        out.setdefault(eqn.primitive.name, where)
        for param in eqn.params.values():
            for x in param if isinstance(param, tuple | list) else (param,):
                if isinstance(x, jcore.ClosedJaxpr):
                    _primitives(x.jaxpr, out, where)
                elif isinstance(x, jcore.Jaxpr):
                    _primitives(x, out, where)


def _candidates():
    m = jnp.full((4, 4), 0.5, jnp.float32)
    v = jnp.full((4,), 0.5, jnp.float32)
    i = jnp.ones((4, 4), jnp.int32)
    b = jnp.ones((4, 4), bool)
    key, raw = jax.random.key(0), jax.random.PRNGKey(0)
    return [(m,), (v,), (m, m), (i,), (i, i), (b,), (b, b), (m, m, m), (v, v),
            (m.astype(jnp.complex64),), (m, 2), (m, 1), (v, 2), (key,), (raw,), (key, (4,)),
            (raw, (4,)), (key, (4,), jnp.float32), (key, v), (key, m), (key, 2), (key, v, v),
            (key, 1.0, 2.0), (key, 2.0, (4,)), (key, m, (4, 4)), (key, 5, (4,)),
            (key, 3, 5, (4,)), (raw, v), (v, 4)]


def _explicit_calls():
    """Functions whose arguments the sweep does not guess: named axes, windows, loops,
    scatters, PRNG implementations, linear algebra."""
    v, i = jnp.ones((4,)), jnp.ones((4,), jnp.int32)
    key = jax.random.key(0)
    idx = jnp.array([0, 2])
    pool = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (1, 1), "VALID")  # noqa: E731
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    return {
        "psum": lambda x: lax.psum(x, "i"), "pmax": lambda x: lax.pmax(x, "i"),
        "pmin": lambda x: lax.pmin(x, "i"), "all_gather": lambda x: lax.all_gather(x, "i"),
        "all_to_all": lambda x: lax.all_to_all(x, "i", 0, 0),
        "psum_scatter": lambda x: lax.psum_scatter(x, "i"),
        "ppermute": lambda x: lax.ppermute(x, "i", [(0, 1), (1, 0)]),
        "axis_index": lambda x: x * lax.axis_index("i"),
        "pbroadcast": lambda x: lax.pbroadcast(x, "i", 0),
        "reduce_window": lambda x: lax.reduce_window(x, 0.0, lambda a, b: a * b, (2, 2),
                                                     (1, 1), "VALID"),
        "reduce_window_sum": lambda x: lax.reduce_window(x, 0.0, lax.add, (2, 2), (1, 1),
                                                         "VALID"),
        "pool_grad": jax.grad(lambda x: jnp.sum(pool(x))),
        "pool_jvp": lambda x: jax.jvp(pool, (x,), (x,)),
        "reduce": lambda x: lax.reduce(x, 1.0, lambda a, b: a * b + 1.0, (0,)),
        "sort": lambda x: lax.sort((x, x), num_keys=1), "top_k": lambda x: lax.top_k(x, 2),
        "approx_max_k": lambda x: lax.approx_max_k(x, 2),
        "scan": lambda x: lax.scan(lambda c, a: (c + a, a), jnp.zeros(4), x),
        "fori_loop": lambda x: lax.fori_loop(0, 3, lambda k, c: c * 2, x),
        "cond": lambda x: lax.cond(x[0, 0] > 0, jnp.sin, jnp.cos, x),
        "switch": lambda x: lax.switch(1, [jnp.sin, jnp.cos], x),
        "map": lambda x: lax.map(jnp.sin, x),
        "associative_scan": lambda x: lax.associative_scan(jnp.add, x),
        "rng_bit_generator": lambda x: lax.rng_bit_generator(jnp.zeros((4,), jnp.uint32), (4,)),
        "rng_uniform": lambda x: lax.rng_uniform(0.0, 1.0, (4,)),
        "reduce_precision": lambda x: lax.reduce_precision(x, 5, 10),
        "with_sharding_constraint": lambda x: lax.with_sharding_constraint(
            x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())),
        "optimization_barrier": lax.optimization_barrier,
        "composite": lambda x: lax.composite(jnp.sin, name="my.sin")(x),
        "platform_dependent": lambda x: lax.platform_dependent(x, cpu=jnp.sin, default=jnp.cos),
        "ragged_dot": lambda x: lax.ragged_dot(x, jnp.ones((2, 4, 4)),
                                               jnp.array([2, 2], jnp.int32)),
        "tile": lambda x: jnp.tile(x, (2, 1)), "stack": lambda x: jnp.stack([x, x]),
        "grad_stack": jax.grad(lambda x: jnp.sum(jnp.stack([x, x]) ** 2)),
        "gather_scatter": lambda x: (x[idx], x.at[idx].set(1.0), x.at[idx].add(1.0),
                                     x.at[idx].mul(2.0), x.at[idx].min(1.0),
                                     x.at[idx].max(1.0)),
        "dynamic_update_slice": lambda x: lax.dynamic_update_slice(x, v[None], (1, 0)),
        "conv": lambda x: lax.conv(x[None, None], x[None, None], (1, 1), "SAME"),
        "cholesky_update": lambda x: lax.linalg.cholesky_update(x, v),
        "householder_product": lambda x: lax.linalg.householder_product(x, v),
        "ormqr": lambda x: lax.linalg.ormqr(x, v, x),
        "lu_pivots_to_permutation": lambda x: lax.linalg.lu_pivots_to_permutation(i, 4),
        "tridiagonal_solve": lambda x: lax.linalg.tridiagonal_solve(v, v, v, x),
        "eig": lambda x: lax.linalg.eig(x), "qdwh": lambda x: lax.linalg.qdwh(x),
        "custom_root": lambda x: lax.custom_root(lambda y: y - 1.0, x, lambda f, y: y,
                                                 lambda f, y: y),
        "random_gamma_grad": lambda x: lax.random_gamma_grad(x, x),
        "empty": lambda x: lax.empty((4,), jnp.float32),
        "after_all": lambda x: lax.after_all(lax.create_token()),
        "dce_sink": lax.dce_sink,
        "scaled_matmul": lambda x: jax.nn.scaled_matmul(x[None], x[None], jnp.ones((1, 4, 1)),
                                                        jnp.ones((1, 4, 1))),
        "dot_product_attention": lambda x: jax.nn.dot_product_attention(
            x[None, :, None], x[None, :, None], x[None, :, None]),
        "searchsorted": lambda x: [jnp.searchsorted(v, v, method=method)
                                   for method in ("scan", "compare_all", "sort")],
        "random": lambda x: (
            jax.random.normal(key, (4,)), jax.random.permutation(key, 4),
            jax.random.choice(key, 4, (2,), replace=False), jax.random.gamma(key, 2.0, (3,)),
            jax.random.poisson(key, 3.0, (3,)), jax.random.categorical(key, x),
            jax.random.bits(jax.random.key(0, impl="rbg"), (4,)),
            jax.random.split(jax.random.key(0, impl="unsafe_rbg")),
            jax.random.randint(key, (3,), 0, 5), jax.random.orthogonal(key, 3),
            jax.random.beta(key, 2.0, 3.0), jax.random.dirichlet(key, v),
            jax.random.multivariate_normal(key, v, x), jax.random.t(key, 3.0),
            jax.random.binomial(key, 4.0, 0.5), jax.random.ball(key, 3)),
    }


@functools.cache
def emitted() -> dict[str, str]:
    """Primitive -> the first function found emitting it (sub-jaxprs included)."""
    out: dict[str, str] = {}
    m = jnp.full((4, 4), 0.5, jnp.float32)
    for name, fn in _explicit_calls().items():
        jaxpr = jax.make_jaxpr(fn, axis_env=[("i", 4)])(m)  # each must trace
        _primitives(jaxpr.jaxpr, out, name)
    seen: set[int] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mod_name, mod in MODULES.items():
            for name in sorted(dir(mod)):
                fn = getattr(mod, name)
                if (name.startswith("_") or not callable(fn) or inspect.isclass(fn)
                        or id(fn) in seen):
                    continue
                seen.add(id(fn))
                for args in _candidates():
                    try:
                        jaxpr = jax.make_jaxpr(fn)(*args)
                    except Exception:  # the arguments did not fit
                        continue
                    _primitives(jaxpr.jaxpr, out, f"{mod_name}.{name}")
                    break
    return out


@pytest.mark.slow
def test_every_emitted_primitive_has_a_rule_or_a_reason():
    found = emitted()
    assert len(found) > 150  # the sweep reached most of the API
    assert {"tile", "stack", "unstack", "psum", "cholesky", "reduce_window_sum"} <= set(found)
    missing = {p: where for p, where in found.items()
               if p not in CATALOGUE and p not in CALLS and p not in UNSUPPORTED
               and p not in ANNOTATIONS}
    assert missing == {}, "give these a rule, or a reason in partir.rules.unsupported"
    wrongly_internal = {p: where for p, where in found.items() if p in NOT_EMITTED}
    assert wrongly_internal == {}, "emitted: move them to UNSUPPORTED"


def test_every_registered_jax_primitive_is_accounted_for():
    registered = jax_primitive_names()
    assert tag_p.name not in registered  # partir's own
    declared = set(CATALOGUE) - OWN_NAMES
    places = {"catalogue": declared, "inlined call": set(CALLS) & registered,
              "annotation": set(ANNOTATIONS), "unsupported": set(UNSUPPORTED),
              "not emitted": set(NOT_EMITTED)}
    assert sorted(registered - set().union(*places.values())) == []
    for a in places:
        for b in places:
            if a < b:
                assert sorted(places[a] & places[b]) == [], (a, b)
    # no stale entries: each listed name is one JAX registers
    assert sorted((set(UNSUPPORTED) | set(NOT_EMITTED) | set(ANNOTATIONS)) - registered) == []
    assert all(UNSUPPORTED.values()) and all(NOT_EMITTED.values())


def test_the_reason_is_shown_where_propagation_stops():
    def f(a):
        return jnp.linalg.cholesky(a @ jnp.swapaxes(a, -1, -2) + 4 * jnp.eye(4))

    a = np.random.default_rng(0).normal(size=(8, 4, 4)).astype(np.float32)
    r = partir.core_partition(f, partir.Mesh({"batch": 4}),
                              [partir.ManualPartition({"a": 0}, axis="batch")], a)
    (c,) = r.unsupported
    assert c.op == "cholesky" and c.detail == UNSUPPORTED["cholesky"]
    assert "linear algebra on whole matrices" in str(c)
    meta = partir.partition(f, partir.Mesh({"batch": 4}),
                            [partir.ManualPartition({"a": 0}, axis="batch")], a)
    (shown,) = meta.tactics[0].conflicts
    assert shown["kind"] == "unsupported" and shown["detail"] == why_unsupported("cholesky")


@pytest.mark.slow
def test_special_functions_and_total_order_comparisons_are_elementwise():
    def f(x, y):
        return (lax.bessel_i0e(x) + lax.bessel_i1e(x) + lax.zeta(x + 2.0, y + 1.0)
                + lax.polygamma(jnp.ones_like(x), y + 1.0) + lax.igamma_grad_a(y + 1.0, x + 1.0)
                + lax.betainc(x + 1.0, y + 1.0, jnp.full_like(x, 0.5)),
                jnp.searchsorted(x[0], y[:, 0], method="compare_all"))

    rng = np.random.default_rng(1)
    x = np.sort(rng.uniform(0.1, 2.0, (8, 8)).astype(np.float32), axis=1)
    y = rng.uniform(0.1, 2.0, (8, 8)).astype(np.float32)
    schedule = [partir.ManualPartition({"x": 0, "y": 0}, axis="batch")]
    r = partir.core_partition(f, partir.Mesh({"batch": 4}), schedule, x, y)
    assert [c.op for c in r.unsupported] == []
    jitted, _ = partir.jit(f, partir.Mesh({"batch": 4}), schedule)
    for got in (r.interpret(x, y), jitted(x, y)):
        for g, e in zip(got, f(x, y), strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=2e-5, atol=2e-5)
