"""The images, built once per test session (per pytest-xdist worker) under the build lock
(tests/helpers/containers.py): a failure, never a skip, where the tools or root are missing."""

import os

import pytest

from helpers import containers


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    """Each target's exact image name (``localhost/spark-checkpoint/TARGET:dev-ID``)."""
    missing = containers.missing_tools()
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: `make images-tools` installs them")
    if os.geteuid() != 0:
        pytest.fail("building and running the images needs root here (as CI has)")
    return containers.build_images()
