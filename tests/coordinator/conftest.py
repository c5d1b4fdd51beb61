import pytest

from helpers.coordinator import Harness


@pytest.fixture
def harness() -> Harness:
    return Harness()
