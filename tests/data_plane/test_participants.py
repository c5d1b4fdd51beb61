"""What `run_coordinated` checks of its participants before anything starts."""

from pathlib import Path
from typing import Any

import pytest

from helpers.driver_environment import driver_environment
from spark_checkpoint import driver
from spark_checkpoint.agent.agent import CheckpointAgent
from spark_checkpoint.driver import run_coordinated
from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint.protocol import RestoreCandidate, RestoredFrom, SkippedImage
from spark_checkpoint.sink import DATA_DIR, StartRefused, TransactionalFileSink


class EarlierParticipant:
    """Written for on_restore(restored_batch), before participants were told the job."""

    def write_batch(self, batch_df: Any, batch_id: int) -> None: ...

    def on_checkpoint_complete(self, batch_id: int) -> None: ...

    def on_restore(self, restored_batch: int | None) -> None: ...

    def __repr__(self) -> str:
        return "EarlierParticipant()"


def _driver_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The variables a runtime gives a driver of job default/orders; the reported error's
    file."""
    for name, value in driver_environment(tmp_path).items():
        monkeypatch.setenv(name, value)
    return tmp_path / "error"


def test_a_participant_of_another_shape_fails_the_start_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    error_file = _driver_environment(tmp_path, monkeypatch)
    sink = TransactionalFileSink(tmp_path / "output")

    with pytest.raises(SystemExit) as ended:
        run_coordinated(None, participants=[sink, EarlierParticipant()])  # type: ignore[arg-type,list-item]

    assert ended.value.code == DriverExit.MISCONFIGURED
    reported = error_file.read_text().splitlines()[1:]
    assert reported == [
        "participant EarlierParticipant() is not a CheckpointParticipant: on_restore must "
        "take (restored_batch, job, checkpoint_location) (too many positional arguments)"
    ]
    assert not (tmp_path / "storage").exists(), "nothing started"


def test_a_link_in_the_output_fails_the_start_as_misconfigured_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another attempt would meet the same link: not a failure to retry.
    error_file = _driver_environment(tmp_path, monkeypatch)
    output = tmp_path / "output"
    (output / DATA_DIR).mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (output / DATA_DIR / "batch-4").symlink_to(tmp_path / "elsewhere")

    with pytest.raises(SystemExit) as ended:
        run_coordinated(None, participants=[TransactionalFileSink(output)])  # type: ignore[arg-type]

    assert ended.value.code == DriverExit.MISCONFIGURED
    assert error_file.read_text().splitlines()[1:] == [
        f"{output / DATA_DIR / 'batch-4'}: is a symbolic link (to "
        f"{str(tmp_path / 'elsewhere')!r}); links are never followed out of the sink's "
        "output directory: remove the link"
    ]


def test_the_agent_reports_a_restore_before_the_participants_discard_what_it_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`on_restore` discards the output staged after the restored image, which the images
    the restore skipped covered: the coordinator must know of the restore (to never
    restore those) before, not only once the query started, which a driver can fail to
    reach (a reviewer)."""
    _driver_environment(tmp_path, monkeypatch)
    restored = RestoredFrom(
        RestoreCandidate.decode("checkpoint:1"),
        3,
        (SkippedImage(RestoreCandidate.decode("checkpoint:2"), "connection reset by peer"),),
    )
    monkeypatch.setattr(driver, "restore", lambda *arguments: restored)
    seen: list[object] = []
    reported = CheckpointAgent.restored

    def restored_and_seen(agent: CheckpointAgent, outcome: RestoredFrom) -> None:
        reported(agent, outcome)
        seen.append(agent.status().restored_from)

    monkeypatch.setattr(CheckpointAgent, "restored", restored_and_seen)

    class Refusing:
        def write_batch(self, batch_df: Any, batch_id: int) -> None: ...

        def on_checkpoint_complete(self, batch_id: int) -> None: ...

        def on_restore(
            self, restored_batch: int | None, job: str, *, checkpoint_location: Any = None
        ) -> None:
            seen.append(("on_restore", restored_batch))
            raise StartRefused("enough seen")

    with pytest.raises(SystemExit) as ended:
        run_coordinated(None, participants=[Refusing()])  # type: ignore[arg-type]

    assert ended.value.code == DriverExit.MISCONFIGURED
    assert seen == [restored, ("on_restore", 3)]


def test_an_output_the_driver_cannot_reach_fails_the_start_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No credentials for the sink's bucket: botocore's error escaped `run_coordinated` as a
    traceback, and the runtime was told nothing (a reviewer's). Another attempt may have
    them (a Secret created late): a failure to retry, not a misconfiguration."""
    error_file = _driver_environment(tmp_path, monkeypatch)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance to ask
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))

    with pytest.raises(SystemExit) as ended:
        run_coordinated(None, participants=[TransactionalFileSink("s3://bucket/out")])  # type: ignore[arg-type]

    assert ended.value.code == DriverExit.FAILED
    assert error_file.read_text().splitlines()[1:] == [
        "participant TransactionalFileSink('s3://bucket/out') could not start: "
        "NoCredentialsError: Unable to locate credentials"
    ]
