import os

# Tests run on 8 virtual CPU devices; this must happen before jax is imported.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")


import pytest


@pytest.fixture(scope="session")
def tiny_inputs():
    """Inputs of the tiny transformer training step (examples/transformer), made once."""
    from examples.transformer import model
    return model.make_inputs(model.TINY)


@pytest.fixture(scope="session")
def tiny_expected(tiny_inputs):
    """The unpartitioned training step's result on `tiny_inputs`."""
    import jax

    from examples.transformer import model
    return jax.jit(model.train_step)(*tiny_inputs)


def pytest_configure(config: pytest.Config) -> None:
    # The fast subset runs a sample of each property suite (tests/budget.py).
    if config.getoption("markexpr", "").replace(" ", "") == "notslow":
        import tests.budget
        tests.budget.FAST = True


# The longest tests (a minute or more each in a full run on 2 cores), started first: with
# `-n 2` (pyproject.toml) each xdist worker takes the next test when it is free, so a long
# test collected last would run alone at the end while the other worker idles.
LONGEST_FIRST = (
    "tests/core/test_properties.py::test_interpreter_matches_function_after_every_tactic",
    "tests/api/test_executed_properties.py::test_jit_executes_like_the_function",
    "tests/core/test_subaxes.py::test_reshape_chains_on_sharded_dims_match_both_oracles",
    "tests/spmd/test_properties.py",
    "tests/core/test_padding_properties.py",
    "tests/hlo/test_oracle.py::test_hlo_interpreter_matches_function",
    "tests/core/tmr/test_random.py::test_threefry_bits_of_one_key_tile",
    "tests/core/test_properties.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((i for i, p in enumerate(LONGEST_FIRST) if item.nodeid.startswith(p)),
                    len(LONGEST_FIRST))
    items.sort(key=rank)  # stable: the rest keep their collection order
