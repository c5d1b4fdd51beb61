"""Bounded waits on storage that does not answer (storage/connections.py), with the user's
fsspec and botocore settings winning key by key."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import fsspec.config
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.objectstore import StorageRoot
from spark_checkpoint.storage import StorageFileSystem
from spark_checkpoint.storage.connections import (
    ATTEMPTS,
    CONNECT_SECONDS,
    READ_SECONDS,
    bounded_options,
    open_url,
)

S3 = ("s3", "s3a")
GCS = ("gs", "gcs")
BOUNDED_S3 = {
    "connect_timeout": CONNECT_SECONDS,
    "read_timeout": READ_SECONDS,
    "retries": {"total_max_attempts": ATTEMPTS},
}


@pytest.fixture(autouse=True)
def configured(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """fsspec's configuration (what FSSPEC_* and FSSPEC_CONFIG_DIR gave at import), empty;
    no botocore retry setting of this machine."""
    conf: dict[str, Any] = {}
    monkeypatch.setattr(fsspec.config, "conf", conf)
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    return conf


def test_s3_waits_are_bounded_by_default() -> None:
    assert bounded_options(S3) == {"config_kwargs": BOUNDED_S3}


def test_the_users_s3_settings_win_key_by_key(configured: dict[str, Any]) -> None:
    """fsspec would let a caller's `config_kwargs` replace the user's whole: the read
    timeout the user gave (FSSPEC_S3_CONFIG_KWARGS) stays, beside the other bounds."""
    configured["s3"] = {"config_kwargs": {"read_timeout": 7}, "anon": True}
    configured["s3a"] = {"anon": False}  # fsspec applies s3a's after s3's

    assert bounded_options(S3) == {
        "config_kwargs": {**BOUNDED_S3, "read_timeout": 7},
        "anon": False,
    }


def test_the_users_retries_replace_the_bounded_ones(
    configured: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore's retry settings are one thing: a mode of the user's is not mixed with our
    attempts; botocore's own (AWS_MAX_ATTEMPTS) win over a client's, so ours are left out."""
    configured["s3"] = {"config_kwargs": {"retries": {"mode": "standard"}}}
    assert bounded_options(S3)["config_kwargs"]["retries"] == {"mode": "standard"}

    configured.clear()
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "4")
    assert "retries" not in bounded_options(S3)["config_kwargs"]


def test_the_retries_of_the_users_profile_count_and_a_config_botocore_cannot_read_is_left_to_it(
    configured: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The profile s3fs is given (FSSPEC_S3_PROFILE) is the one whose `max_attempts` counts;
    a broken ~/.aws/config is said by s3fs, as one line, when it reads it."""
    config = tmp_path / "config"
    config.write_text("[profile steady]\nmax_attempts = 4\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    assert "retries" in bounded_options(S3)["config_kwargs"]
    configured["s3"] = {"profile": "steady"}
    assert "retries" not in bounded_options(S3)["config_kwargs"]

    config.write_text("[profile steady\nmax_attempts")
    assert bounded_options(S3)["config_kwargs"]["retries"] == {"total_max_attempts": ATTEMPTS}


def test_a_setting_of_the_wrong_shape_is_said_naming_the_setting(
    configured: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each was one line naming no setting: "'str' object has no attribute 'copy'",
    "invalid literal for int() with base 10: 'x'" (an outside-in tester's)."""
    configured["s3"] = {"config_kwargs": "not json"}
    with pytest.raises(ValueError, match=r"^fsspec's configuration for s3:// gives config_kwargs "):
        bounded_options(S3)
    with pytest.raises(ValueError, match="FSSPEC_S3_CONFIG_KWARGS"):
        bounded_options(S3)

    configured.clear()
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "x")
    with pytest.raises(
        ValueError, match=r"^AWS_MAX_ATTEMPTS \(or max_attempts in the AWS config\): "
    ):
        bounded_options(S3)


def test_gcs_reads_are_bounded_per_socket_read_not_per_request(
    configured: dict[str, Any],
) -> None:
    """gcsfs sets no timeout at all by default; a number would bound a whole request, the
    read of a large object's body with it."""
    (timeout,) = bounded_options(GCS).values()
    assert timeout == aiohttp.ClientTimeout(sock_connect=CONNECT_SECONDS, sock_read=READ_SECONDS)

    configured["gcs"] = {"requests_timeout": 300}
    assert bounded_options(GCS) == {"requests_timeout": 300}


def test_other_storage_gets_nothing(configured: dict[str, Any]) -> None:
    configured["file"] = {"auto_mkdir": True}
    assert bounded_options(("file", "local")) == {"auto_mkdir": True}


_LEAVES = st.dictionaries(
    st.sampled_from(["connect_timeout", "read_timeout", "max_pool_connections"]),
    st.integers(1, 100),
)
_OPTIONS = st.fixed_dictionaries(
    {}, optional={"config_kwargs": _LEAVES, "anon": st.booleans(), "requester_pays": st.booleans()}
)


@given(s3=_OPTIONS, s3a=_OPTIONS)
def test_every_setting_given_wins_and_every_bound_not_given_stays(
    s3: dict[str, Any], s3a: dict[str, Any]
) -> None:
    fsspec.config.conf.clear()
    fsspec.config.conf.update({"s3": s3, "s3a": s3a})

    options = bounded_options(S3)

    expected = {**BOUNDED_S3, **s3.get("config_kwargs", {}), **s3a.get("config_kwargs", {})}
    assert options["config_kwargs"] == expected
    for key in ("anon", "requester_pays"):
        if key in s3 or key in s3a:
            assert options[key] == s3a.get(key, s3.get(key))
        else:
            assert key not in options


def test_the_bounds_reach_the_s3_client(s3_root: StorageRoot, configured: dict[str, Any]) -> None:
    """What botocore and s3fs were made with, not only what was asked for."""
    configured["s3"] = {"config_kwargs": {"read_timeout": 7}}
    storage = StorageFileSystem.for_url(s3_root.url, fresh=True)
    storage.list_dir(s3_root.url)

    s3fs = storage._fs
    config = s3fs.s3.meta.config
    assert (config.connect_timeout, config.read_timeout) == (CONNECT_SECONDS, 7)
    assert config.retries["total_max_attempts"] == ATTEMPTS
    assert s3fs.retries == ATTEMPTS


def test_our_options_win_over_the_users_where_storage_needs_them(
    s3_root: StorageRoot, configured: dict[str, Any]
) -> None:
    """A listings cache would show what another process (a cleanup pod, the next driver)
    changed as it was: FSSPEC_S3_USE_LISTINGS_CACHE=true made every storage command fail
    with a traceback (the option given twice) before it was ours that counted."""
    configured["s3"] = {"use_listings_cache": True, "skip_instance_cache": False}
    storage = StorageFileSystem.for_url(s3_root.url, fresh=True)

    assert storage._fs.dircache.use_listings_cache is False
    assert storage.list_dir(s3_root.url) == []


@contextlib.contextmanager
def _silent_endpoint() -> Iterator[tuple[str, list[socket.socket]]]:
    """An endpoint that accepts connections and never answers; the connections it took."""
    accepted: list[socket.socket] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def accept() -> None:
            with contextlib.suppress(OSError):
                while True:
                    accepted.append(listener.accept()[0])

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
        finally:
            listener.shutdown(socket.SHUT_RDWR)
            for connection in accepted:
                connection.close()


def test_a_command_against_an_endpoint_that_never_answers_gives_up(tmp_path: Any) -> None:
    """It waited 7 minutes (25 connections, each left after a 15 s read). Counted in
    connections, not seconds: s3fs's tries times botocore's attempts, the read timeout the
    user gave (1 s) kept beside them."""
    with _silent_endpoint() as (endpoint, accepted):
        environment = {
            **os.environ,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "k",
            "AWS_SECRET_ACCESS_KEY": "s",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": os.devnull,
            "FSSPEC_S3_CONFIG_KWARGS": '{"read_timeout": 1}',
        }
        environment.pop("AWS_MAX_ATTEMPTS", None)
        command = [sys.executable, "-m", "spark_checkpoint_operator.cli", "list"]
        listed = subprocess.run(
            [
                *command,
                "--storage",
                "s3://bucket/root",
                "--job",
                "orders",
                "--state-dir",
                str(tmp_path),
            ],
            env=environment,
            capture_output=True,
            text=True,
            timeout=300,  # a hang, not a measure: the bounded wait is about 5 s
            check=False,
        )

    assert listed.returncode != 0
    assert len(listed.stderr.splitlines()) == 1, listed.stderr
    assert "s3://bucket/root" in listed.stderr, listed.stderr
    assert len(accepted) == ATTEMPTS * ATTEMPTS, listed.stderr


@pytest.mark.parametrize(
    ("url", "library"), [("s3://b/x", "s3fs"), ("abfs://c/x", "adlfs"), ("gs://b/x", "gcsfs")]
)
def test_an_object_store_without_its_library_names_the_extra_that_installs_it(
    without_library: Callable[[str], None], url: str, library: str
) -> None:
    """fsspec said only "Install s3fs to access S3" (a reviewer's, with the wheel alone)."""
    without_library(library)
    with pytest.raises(ImportError) as missing:
        open_url(url)
    assert str(missing.value).endswith(
        "(pip install 'spark-checkpoint-operator[spark]' installs s3fs, adlfs, gcsfs)"
    )
    assert library in str(missing.value), "fsspec's own words first"


def test_another_protocols_missing_library_is_left_as_fsspec_says_it() -> None:
    with pytest.raises(ImportError) as missing:
        open_url("oci://bucket@namespace/x")  # ocifs: not installed here, nor an extra's
    assert str(missing.value) == "Install ocifs to access OCI Object Storage"
