"""Fixtures shared by the test packages: the object-store servers (helpers/objectstore), each
started on first use, once per session, and stopped at its end; a faulty proxy in front of
one. Also the JVM settings of every Spark driver the tests start (helpers/spark_jvm)."""

import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

# As every process of the product: it chooses gcsfs's classic filesystem (spark_checkpoint's
# __init__), which must happen before anything imports gcsfs.
import spark_checkpoint  # noqa: F401
from helpers.faulty_proxy import ConditionIgnoringProxy, FaultyProxy
from helpers.objectstore import (
    AzureServer,
    GCSServer,
    S3Server,
    StorageRoot,
    start_azure_server,
    start_gcs_server,
    start_s3_server,
    storage_roots,
    with_credentials_set,
)
from helpers.spark_jvm import driver_options

_ARCHIVE_SAID = pytest.StashKey[str]()
_JVM_TEMPORARY = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Sets SPARK_SUBMIT_OPTS once, in the process that starts the others (xdist's workers
    inherit it): with pytest's cache, the class archive lives there. The drivers' temporary
    files go to a directory of the run's own, removed at its end: Spark's local directories
    and the native libraries lz4 and RocksDB unpack (14 MB) go to java.io.tmpdir, and the
    JVMs of drivers the tests kill leave them there (~300 MB a run in /tmp)."""
    if hasattr(config, "workerinput"):
        return
    cache = getattr(config, "cache", None)
    directory = None if cache is None else cache.mkdir("spark-class-archive")
    options, config.stash[_ARCHIVE_SAID] = driver_options(directory)
    temporary = config.stash[_JVM_TEMPORARY] = Path(tempfile.mkdtemp(prefix="spark-tests-jvm-"))
    # A setting of one's own comes last, so that it wins.
    os.environ["SPARK_SUBMIT_OPTS"] = (
        f"{options} -Djava.io.tmpdir={temporary} {os.environ.get('SPARK_SUBMIT_OPTS', '')}"
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    if (temporary := config.stash.get(_JVM_TEMPORARY, None)) is not None:
        shutil.rmtree(temporary, ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [
        f"Spark drivers: {config.stash.get(_ARCHIVE_SAID, '')}",
        f"machine speed: {_loop_seconds():.2f} CPU-s for 5 million steps of a Python loop",
    ]


def _loop_seconds(steps: int = 5_000_000) -> float:
    """The CPU time of a plain loop: how fast the machine runs Python as the suite starts,
    one of the things a shared host's load changes: 0.33-0.37 s here on the evening of
    2026-12-07 (at a module's top level, with globals, the loop is ~3 times slower); the
    suite took 32 minutes at 0.34 that evening, slowed by something this does not show."""
    started = time.process_time()
    total = 0
    for step in range(steps):
        total += step
    return time.process_time() - started


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = start_s3_server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GCSServer]:
    server = start_gcs_server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azure_server() -> Iterator[AzureServer]:
    server = start_azure_server()
    yield server
    server.stop()


def _logging_set_up() -> tuple[Any, ...]:
    """The root logger's handlers (not pytest's own, added and removed around each phase)
    and level; asyncio's logger's (Kopf's set-up changes it too)."""
    root, asyncio_log = logging.getLogger(), logging.getLogger("asyncio")
    handlers = [h for h in root.handlers if not type(h).__module__.startswith("_pytest")]
    return handlers, root.level, asyncio_log.handlers[:], asyncio_log.propagate


@pytest.fixture(autouse=True)
def _logging_left_as_found() -> Iterator[None]:
    """A test that sets up logging in-process (Kopf's run, `logging.basicConfig`) must give
    it back: a handler bound to its captured stderr, closed after it, made every later
    test of the worker print "--- Logging error ---" tracebacks (from any server thread
    still logging) into its own stderr, and fail there. Given back here too, so that only
    the test that changed it fails."""
    root, asyncio_log = logging.getLogger(), logging.getLogger("asyncio")
    before = _logging_set_up()
    yield
    after = _logging_set_up()
    if after != before:
        pytest_handlers = [h for h in root.handlers if type(h).__module__.startswith("_pytest")]
        handlers, level, asyncio_log.handlers[:], asyncio_log.propagate = before
        root.handlers[:] = [*handlers, *pytest_handlers]
        root.setLevel(level)
    assert after == before, "the test left logging changed (give it back)"


@pytest.fixture(autouse=True)
def _fresh_filesystem_instances() -> Iterator[None]:
    """fsspec keeps one filesystem instance per set of arguments, whatever credentials the
    environment held when it was made: a test that sets other ones (an account without a
    key) would hand its instance to the next test on the same worker, which then waits on
    a metadata service for credentials. In a real process the environment does not change
    under the product's feet."""
    yield
    for protocol in ("s3", "gs", "abfs"):
        fsspec.get_filesystem_class(protocol).clear_instance_cache()


@pytest.fixture
def s3_root(s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StorageRoot:
    """A fresh root on the S3 server; its credentials are in the environment, as in a pod."""
    return with_credentials_set(storage_roots("s3", tmp_path, lambda _kind: s3_server), monkeypatch)


@pytest.fixture
def gcs_root(gcs_server: GCSServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StorageRoot:
    """A fresh root on the GCS server; its endpoint is in the environment, as in a pod."""
    return with_credentials_set(
        storage_roots("gcs", tmp_path, lambda _kind: gcs_server), monkeypatch
    )


@pytest.fixture
def azure_root(
    azure_server: AzureServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> StorageRoot:
    """A fresh root on the Azure server (Azurite); its credentials are in the environment."""
    return with_credentials_set(
        storage_roots("azure", tmp_path, lambda _kind: azure_server), monkeypatch
    )


@pytest.fixture
def without_library(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Makes an fsspec library (gcsfs, s3fs, ...) one that cannot be imported, as in an
    image of the user's own without it, though this process registered it already."""

    def remove(library: str) -> None:
        monkeypatch.setitem(sys.modules, library, None)
        # fsspec's module (its package's `registry` is a read-only view of this dict).
        registered = sys.modules["fsspec.registry"]._registry
        for protocol in [p for p, c in registered.items() if c.__module__.startswith(library)]:
            monkeypatch.delitem(registered, protocol)

    return remove


@pytest.fixture
def without_gcsfs(without_library: Callable[[str], None]) -> None:
    """fsspec says "Please install gcsfs to access Google Storage" for gs://."""
    without_library("gcsfs")


StartProxy = Callable[[StorageRoot, "re.Pattern[bytes]", bytes | None], FaultyProxy]


@pytest.fixture
def faulty_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[StartProxy]:
    """``faulty_proxy(root, request_line, answer)``: a FaultyProxy (helpers/faulty_proxy.py)
    in front of the server of the object-store root `root`; what starts afterwards reaches
    the server through it (the endpoint in the environment is the proxy's)."""
    proxies: list[FaultyProxy] = []

    def start(
        root: StorageRoot, request_line: re.Pattern[bytes], answer: bytes | None
    ) -> FaultyProxy:
        proxies.append(
            _route_through(
                root, lambda upstream: FaultyProxy(upstream, request_line, answer), monkeypatch
            )
        )
        return proxies[-1]

    yield start
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def condition_ignoring_store(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[StorageRoot], FaultyProxy]]:
    """``condition_ignoring_store(root)``: the server of `root` as a store that ignores
    conditional writes (helpers/faulty_proxy.py's ConditionIgnoringProxy), for what starts
    afterwards."""
    proxies: list[FaultyProxy] = []

    def start(root: StorageRoot) -> FaultyProxy:
        proxies.append(_route_through(root, ConditionIgnoringProxy, monkeypatch))
        return proxies[-1]

    yield start
    for proxy in proxies:
        proxy.close()


def _route_through(
    root: StorageRoot, proxy_of: Callable[[str], FaultyProxy], monkeypatch: pytest.MonkeyPatch
) -> FaultyProxy:
    """A proxy (`proxy_of` its server's URL) in front of the server of the object-store
    root `root`: the endpoint in the environment is the proxy's from now on."""
    upstream = next(
        match[0]
        for value in root.environment.values()
        if (match := re.search(r"http://127\.0\.0\.1:[0-9]+", value))
    )
    proxy = proxy_of(upstream)
    for name, value in root.environment.items():
        monkeypatch.setenv(name, value.replace(upstream, proxy.url))
    return proxy


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that run Spark or build images first, each module's tests kept together
    (module fixtures start once): `make test`'s xdist scheduler (worksteal) hands each
    worker a contiguous share of the list and idle workers take the end of another's share,
    so the long tests ahead of the short ones let the workers finish together."""
    slow = {
        item.path
        for item in items
        if item.get_closest_marker("spark") or item.get_closest_marker("images")
    }
    items.sort(key=lambda item: item.path not in slow)
