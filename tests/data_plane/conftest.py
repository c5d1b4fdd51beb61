from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.agent import Running


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    """A real agent serving over HTTP against a synthetic live location."""
    job = Running(tmp_path)
    job.server.start()
    yield job
    job.server.stop()
    job.agent.close()
