"""Session fixtures shared by the test packages: the object-store servers (helpers/objectstore),
each started on first use, once per session, and stopped at its end."""

from collections.abc import Iterator

import fsspec
import pytest

from helpers.objectstore import AzureServer, S3Server, start_azure_server, start_s3_server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = start_s3_server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azure_server() -> Iterator[AzureServer]:
    server = start_azure_server()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _fresh_filesystem_instances() -> Iterator[None]:
    """fsspec keeps one filesystem instance per set of arguments, whatever credentials the
    environment held when it was made: a test that sets other ones (an account without a
    key) would hand its instance to the next test on the same worker, which then waits on
    a metadata service for credentials. In a real process the environment does not change
    under the product's feet."""
    yield
    for protocol in ("s3", "abfs"):
        fsspec.get_filesystem_class(protocol).clear_instance_cache()
