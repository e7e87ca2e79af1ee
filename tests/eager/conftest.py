import pytest

import torch2jax.eager as te


@pytest.fixture(scope="session", autouse=True)
def jax_device():
    """The jax device, registered once for the test session (it cannot be unregistered)."""
    te.enable()
