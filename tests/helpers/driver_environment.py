"""The variables a runtime gives a driver process (`DriverSettings.to_environment`), for
tests that run `run_coordinated` without a runtime."""

from pathlib import Path

from spark_checkpoint.protocol import StorageOwner
from spark_checkpoint.settings import DriverSettings


def driver_environment(tmp_path: Path, storage_root: str | None = None) -> dict[str, str]:
    """A driver of job default/orders, attempt 1, with nothing to restore, storing under
    ``storage_root`` (else ``tmp_path/storage``); it reports its error to ``tmp_path/error``."""
    settings = DriverSettings(
        namespace="default",
        job="orders",
        storage_root=storage_root or str(tmp_path / "storage"),
        work_dir=tmp_path / "work",
        agent_host="127.0.0.1",
        agent_port=0,
        token="t",
        attempt=1,
        restore_candidates=(),
        owner=StorageOwner(id="registry-1", description="these tests"),
    )
    token_file = tmp_path / "token"
    token_file.write_text("t")
    return settings.to_environment(token_file, tmp_path / "error")
