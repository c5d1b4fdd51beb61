"""How long storage waits for an endpoint that does not answer: bounded by default.

The fsspec libraries' own defaults wait minutes, or for ever, on an endpoint that accepts a
connection and never answers: one S3 listing took 423 s there (s3fs's 5 tries times
botocore's 5 attempts times a 15 s read), gcsfs sets no timeout at all. Ours bound the
connect and each socket read (not a whole request: a slow but live transfer goes on) and
try twice at each of the two levels, about 80 s in all. Whatever the user gives fsspec
(FSSPEC_S3, FSSPEC_S3_CONFIG_KWARGS, a file in FSSPEC_CONFIG_DIR) wins, key by key at every
level, as do botocore's own retry settings (AWS_MAX_ATTEMPTS, `max_attempts` in
~/.aws/config).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import fsspec
import fsspec.config
from fsspec.core import split_protocol, url_to_fs
from fsspec.registry import known_implementations

CONNECT_SECONDS = 5
# Per socket read, also while a body streams.
READ_SECONDS = 20
# At each level that retries: botocore's attempts, s3fs's tries around them.
ATTEMPTS = 2
# The object stores' fsspec libraries, which the distribution's `spark` extra installs.
_EXTRA_LIBRARIES = ("s3fs", "adlfs", "gcsfs")


def open_url(url: str, **options: Any) -> tuple[Any, str]:
    """fsspec's filesystem and path for `url` (`url_to_fs`), with bounded waits
    (`bounded_options`) and `options`, which win over the user's (no listings cache: other
    processes change storage)."""
    protocol = split_protocol(url)[0] or "file"
    try:
        protocols = protocols_of(fsspec.get_filesystem_class(protocol))
    except ImportError as error:  # "Install s3fs to access S3"
        library = known_implementations.get(protocol, {}).get("class", "")
        if library.partition(".")[0] not in _EXTRA_LIBRARIES:
            raise
        raise ImportError(
            f"{error} (pip install 'spark-checkpoint-operator[spark]' installs "
            f"{', '.join(_EXTRA_LIBRARIES)})"
        ) from None
    fs, path = url_to_fs(url, **{**bounded_options(protocols), **options})
    if "s3" in protocols:
        # s3fs's tries are its class's (it hands a `retries` option on to aiobotocore,
        # which refuses it).
        fs.retries = ATTEMPTS
    return fs, path


def bounded_options(protocols: tuple[str, ...]) -> dict[str, Any]:
    """The options a filesystem of `protocols` is made with: the bounded waits under what
    fsspec's configuration gives, merged as fsspec applies it (each protocol's in order,
    later ones winning), but key by key in nested options (fsspec lets a caller's
    `config_kwargs` replace the user's whole)."""
    given: dict[str, Any] = {}
    for protocol in protocols:
        given = _merged(given, fsspec.config.conf.get(protocol, {}))
    for key, value in given.items():
        # The libraries' options of options (s3fs's config_kwargs, client_kwargs, ...):
        # one that is no mapping failed later as "'str' object has no attribute 'copy'".
        if key.endswith("_kwargs") and not isinstance(value, Mapping):
            setting = f"FSSPEC_{protocols[0].upper()}_{key.upper()}"
            raise ValueError(
                f"fsspec's configuration for {protocols[0]}:// gives {key} as {value!r}, not "
                f"an object ({setting}, FSSPEC_{protocols[0].upper()} or a file in "
                "FSSPEC_CONFIG_DIR: a JSON object)"
            )
    return _merged(_bounds(protocols, given), given)


def _bounds(protocols: tuple[str, ...], given: Mapping[str, Any]) -> dict[str, Any]:
    if "s3" in protocols:
        config: dict[str, Any] = {"connect_timeout": CONNECT_SECONDS, "read_timeout": READ_SECONDS}
        attempts_set = _botocore_attempts_set(given.get("profile"))
        if "retries" not in given.get("config_kwargs", {}) and not attempts_set:
            config["retries"] = {"total_max_attempts": ATTEMPTS}
        return {"config_kwargs": config}
    if "gs" in protocols:
        # gcsfs's own client, there wherever gcsfs is (the `spark` extra).
        import aiohttp  # noqa: PLC0415

        # A number would bound the whole request, its body read included.
        timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_SECONDS, sock_read=READ_SECONDS)
        return {"requests_timeout": timeout}
    return {}


def _botocore_attempts_set(profile: str | None) -> bool:
    """Whether botocore's retries are configured for `profile` (AWS_MAX_ATTEMPTS,
    `max_attempts` in ~/.aws/config): a client's own `retries` would override them. A
    configuration botocore cannot read says so when s3fs reads it, as one line."""
    # s3fs's, there wherever s3fs is (the `spark` extra).
    import botocore.exceptions  # type: ignore[import-untyped]  # noqa: PLC0415
    import botocore.session  # type: ignore[import-untyped]  # noqa: PLC0415

    try:
        session = botocore.session.Session(profile=profile)
        return session.get_config_variable("max_attempts") is not None
    except botocore.exceptions.BotoCoreError:
        return False
    except ValueError as error:  # botocore's int() of it
        where = f"max_attempts of AWS profile {profile!r}" if profile else "max_attempts"
        raise ValueError(f"AWS_MAX_ATTEMPTS (or {where} in the AWS config): {error}") from None


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            merged[key] = _merged(below, value)
        else:
            merged[key] = value
    return merged


def protocols_of(fs: Any) -> tuple[str, ...]:
    """The protocols an fsspec filesystem (or its class) answers to: ("s3", "s3a")."""
    protocol = getattr(fs, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
