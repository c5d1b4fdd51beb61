"""The docs' `spark-checkpoint` examples that need a job with checkpoints in storage: run as
written, with the installed command line, against storage the storage package wrote."""

import re
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

from helpers.doc_blocks import ROOT, marked_blocks, run_shell
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    JobStorageLayout,
    TaskAcknowledgement,
)
from spark_checkpoint_operator.manifest.loading import load_manifest

EXAMPLE_MANIFEST = ROOT / "examples" / "wordcount" / "job.yaml"


def _checkpoint(storage: CheckpointStorage, spark_dir: Path, checkpoint_id: int) -> None:
    """Checkpoint ``checkpoint_id`` as the agent stores it: shared files, then `_metadata`."""
    files = {f"offsets/{checkpoint_id}": b"v1\n{}\n", f"commits/{checkpoint_id}": b"v1\n{}\n"}
    entries = []
    for relative, content in files.items():
        local = spark_dir / relative
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(content)
        entries.append(storage.add_shared_file(str(local), relative))
    completion = datetime.now(UTC)
    storage.write_metadata(
        CheckpointMetadata(
            namespace=storage.layout.namespace,
            job=storage.layout.job,
            checkpoint_id=checkpoint_id,
            kind=CheckpointKind.CHECKPOINT,
            batch_id=checkpoint_id,
            query_id="0b7c6a0e-5a2f-4a4e-9b52-8d1f0f3a6c11",
            trigger_time=completion - timedelta(seconds=1),
            completion_time=completion,
            acknowledgements=(
                TaskAcknowledgement(
                    task="logs",
                    files=tuple(e.path for e in entries),
                    bytes=sum(e.size for e in entries),
                    duration_ms=12,
                ),
            ),
            files=tuple(entries),
            total_bytes=sum(e.size for e in entries),
            properties={"attempt": "1"},
        )
    )


def _example_with_checkpoints(manifest_path: Path, checkpoint_ids: tuple[int, ...]) -> None:
    """The example's manifest at ``manifest_path``, with checkpoints in its default storage
    (``.spark-checkpoint/storage`` next to it), where `spark-checkpoint run` puts them."""
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLE_MANIFEST, manifest_path)
    manifest = load_manifest(manifest_path)
    assert manifest.spec.checkpointing.storage is None, "the example uses the default storage"
    layout = JobStorageLayout(
        str(manifest_path.parent / ".spark-checkpoint" / "storage"),
        manifest.namespace,
        manifest.name,
    )
    storage = CheckpointStorage(layout)
    for checkpoint_id in checkpoint_ids:
        _checkpoint(storage, manifest_path.parent / "spark", checkpoint_id)


def test_readme_storage_commands_run_on_a_job_with_checkpoints(tmp_path: Path) -> None:
    """The reader's job.yaml is the example's (default local storage); checkpoints 6 and 7
    are in that storage, where `spark-checkpoint run job.yaml` from here puts them."""
    (block,) = marked_blocks(
        "tests/docs/test_cli_examples.py::test_readme_storage_commands_run_on_a_job_with_checkpoints"
    )
    _example_with_checkpoints(tmp_path / "job.yaml", (6, 7))

    out = run_shell(block, tmp_path)

    # Each command found the job's images, not an empty storage.
    assert re.search(r"checkpoint\s+7\b", out), out
    assert re.search(r"checkpoint\s+6\b", out), out
    assert "completed" in out, out  # the simulation's summary


def test_the_guides_first_run_leaves_checkpoints_to_list_and_inspect(tmp_path: Path) -> None:
    """The guide's reader ran examples/wordcount/job.yaml from the repository's root and
    stopped it with Ctrl-C, which keeps its checkpoints (here 1 and 2) in the default
    storage, next to the manifest."""
    (block,) = marked_blocks(
        "tests/docs/test_cli_examples.py::test_the_guides_first_run_leaves_checkpoints_to_list_and_inspect"
    )
    _example_with_checkpoints(tmp_path / "examples" / "wordcount" / "job.yaml", (1, 2))

    out = run_shell(block, tmp_path)

    assert re.search(r"^checkpoint\s+1\s+1\s", out, flags=re.MULTILINE), out  # list
    assert re.search(r"^checkpoint\s+2\s+2\s", out, flags=re.MULTILINE), out
    assert re.search(r"^checkpoint\s+2\s+2\s+\d{4}-\d\d-\d\dT", out, flags=re.MULTILINE), out
    assert "query_id: 0b7c6a0e-5a2f-4a4e-9b52-8d1f0f3a6c11" in out, out  # inspect -o yaml
    assert "2 verified: 2 OK, 0 failed" in out, out  # verify
