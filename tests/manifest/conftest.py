from pathlib import Path
from typing import Any

import pytest
import yaml

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def minimal() -> dict[str, Any]:
    """A fresh copy of fixtures/minimal-job.yaml for a test to change."""
    document: dict[str, Any] = yaml.safe_load((FIXTURES / "minimal-job.yaml").read_text())
    return document


@pytest.fixture
def full() -> dict[str, Any]:
    """A fresh copy of fixtures/full-job.yaml for a test to change."""
    document: dict[str, Any] = yaml.safe_load((FIXTURES / "full-job.yaml").read_text())
    return document
