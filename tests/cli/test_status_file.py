"""A status file the storage commands cannot read is ignored with a one-line warning that
names the file and the field; the listing goes on without the registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Job, Result

Cli = Callable[..., "Result"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\xff\xfe", "cannot read"),
        (b"{", "not JSON"),
        (b"[]", "not an object"),
        (b'{"metadata": ["x"], "driver": [7]}', "status: missing"),
        (b'{"status": []}', "status: missing"),
        (b'{"status": {}}', "status.coordinator: missing"),
        (b'{"status": {"coordinator": []}}', "status.coordinator: not an object"),
        (
            b'{"status": {"coordinator": {"savepoints": {}}}}',
            "status.coordinator.savepoints: not a list",
        ),
        (
            b'{"status": {"coordinator": {"checkpoints": [7]}}}',
            "status.coordinator.checkpoints[0].id",
        ),
        (b'{"status": {"coordinator": {"checkpoints": [{"id": true}]}}}', "got True"),
        (b'{"status": {"coordinator": {"checkpoints": [{"id": -1}]}}}', "got -1"),
    ],
)
def test_an_unreadable_status_file_is_a_warning(
    job: Job, cli: Cli, content: bytes, problem: str
) -> None:
    job.status_file.parent.mkdir(parents=True)
    job.status_file.write_bytes(content)

    result = cli("list", *job.flags)

    assert result.code == 0, result.err
    [warning] = result.err.splitlines()
    assert warning.startswith(f"warning: registry ignored: {job.status_file.resolve()}: ")
    assert problem in warning
    assert "registry: none" in result.out
