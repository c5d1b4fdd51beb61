"""Session fixtures shared by the test packages: the object-store servers (helpers/objectstore),
each started on first use, once per session, and stopped at its end."""

from collections.abc import Iterator

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
