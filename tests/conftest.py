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


# Tests run on two xdist workers (`-n 2 --dist worksteal`, pyproject.toml): each worker
# starts with a share of the tests in order, and one that runs out takes tests from the
# other's share. The files of the longest tests are put first, or one collected last
# would run alone at the end while the other worker idles.
LONGEST_FIRST = (  # seconds in a full run on a quiet 2-core machine
    "tests/tactics/test_pipelining.py",  # 210
    "tests/core/test_padding_properties.py",  # 160
    "tests/core/test_properties.py",  # 140
    "tests/tactics/test_auto_models.py",  # 125
    "tests/examples/test_transformer_core.py",  # 125
    "tests/core/tmr/test_random.py",  # 125
    "tests/api/test_executed_properties.py",  # 115
    "tests/api/test_control_flow.py",  # 115
    "tests/examples/test_unet.py",  # 110
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)  # stable: each file's tests, and the other files, keep their order
