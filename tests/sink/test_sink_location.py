"""Where TransactionalFileSink may write: a local directory, never an object store it
cannot commit to atomically."""

from pathlib import Path

import pytest

from spark_checkpoint.sink import TransactionalFileSink


@pytest.mark.parametrize(
    "uri",
    ["s3a://bucket/output/orders", "gs://bucket/out", "abfss://c@account/out", "file://host/out"],
)
def test_a_uri_of_another_filesystem_is_refused_before_anything_is_written(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as refused:
        TransactionalFileSink(uri)
    assert str(refused.value).startswith(
        f"TransactionalFileSink writes to a local filesystem only, not {uri!r}"
    )
    assert list(tmp_path.iterdir()) == [], "nothing is created (such as a directory 's3a:')"


def test_a_file_uri_is_its_local_path(tmp_path: Path) -> None:
    target = tmp_path / "out put"
    sink = TransactionalFileSink(target.as_uri())
    assert sink.output_dir == target
    assert (target / "committed").is_dir()
