import pytest
from hypothesis import settings

from helpers.coordinator import Harness

# `make mutation-coordinator` runs the property machine once per mutant: fewer examples,
# derandomized, so that a mutant's verdict does not depend on the luck of one run.
settings.register_profile("mutation", max_examples=25, derandomize=True, database=None)


@pytest.fixture
def harness() -> Harness:
    return Harness()
