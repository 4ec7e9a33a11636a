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
