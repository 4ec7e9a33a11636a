import os

import pytest

from tests.xla import set_flags

# Tests run on 8 virtual CPU devices, with XLA's cheap code generation (tests/xla.py);
# this must happen before jax is imported.
set_flags()
os.environ.setdefault("JAX_PLATFORMS", "cpu")


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


# Tests run on two xdist workers (`-n 2 --dist loadfile`, pyproject.toml), a file's tests on
# one worker, so they share its warm JAX/XLA compilation caches and module-level caches
# (`--dist load` spread them and compiled the same programs on both workers: ~15% more
# CPU). A worker takes the next file when it is free; the files of the longest tests
# (a minute or more each in a full run on 2 cores) are started first, or one collected
# last would run alone at the end while the other worker idles.
LONGEST_FIRST = (  # the longest files first (seconds on a quiet 2-core machine, one worker)
    "tests/core/test_properties.py",  # 175
    "tests/core/test_padding_properties.py",  # 95
    "tests/api/test_executed_properties.py",  # 92
    "tests/examples/test_unet.py",  # 80
    "tests/core/test_subaxes.py",  # 70
    "tests/core/tmr/test_random.py",  # 55
    "tests/examples/test_transformer_core.py",  # 55
    "tests/api/test_models.py",  # 50
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)  # stable: each file's tests, and the other files, keep their order
