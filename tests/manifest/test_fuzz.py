"""Fuzzing the manifest loader the way `spark-checkpoint run` uses it: whatever the file
holds, the answer is a usable manifest or a ManifestError whose lines each name the file
(and, for a bad value, the field); never a traceback, and nothing created on rejection."""

import contextlib
import io
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.hostile import hostile_yaml, mutated
from spark_checkpoint_operator import cli
from spark_checkpoint_operator.manifest.loading import manifest_from_document, parse_manifest
from spark_checkpoint_operator.manifest.model import JobManifest
from spark_checkpoint_operator.manifest.problems import ManifestError
from spark_checkpoint_operator.manifest.problems import render_path as _render
from spark_checkpoint_operator.manifest.validation import MAX_PROBLEMS

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_usable(job: JobManifest) -> None:
    """What the loader accepts, the coordinator and the pods can use."""
    config = job.coordinator_config()
    checkpointing = job.spec.checkpointing
    for number in (
        checkpointing.retained,
        checkpointing.max_concurrent,
        checkpointing.tolerable_failures,
        job.spec.executor.instances,
        job.spec.driver.cores,
        job.spec.savepoints.history_max_count,
    ):
        assert type(number) is int
    for nonce in (job.spec.checkpoint_trigger_nonce, job.spec.savepoint_trigger_nonce):
        assert nonce is None or (type(nonce) is int and -(1 << 63) <= nonce < 1 << 63)
    durations = [config.min_pause, config.timeout, job.spec.restart_policy.backoff]
    assert all(math.isfinite(d) and d >= 0 for d in durations)
    assert len(job.name) <= 63 and "\n" not in job.name + job.namespace
    assert job.spec.driver.memory_mib > 0 and job.spec.executor.memory_mib > 0


def _check_message(error: ManifestError, source: str) -> None:
    lines = str(error).split("\n")
    assert len(lines) == len(error.problems) <= MAX_PROBLEMS + 1
    for line in lines:
        assert line.startswith(f"{source}: ") and len(line) < 500, line


@FUZZ
@given(case=mutated())
def test_a_changed_manifest_is_usable_or_rejected_naming_the_field(
    case: tuple[Any, tuple[str | int, ...]],
) -> None:
    document, path = case
    try:
        job = manifest_from_document(document, "job.yaml")
    except ManifestError as error:
        _check_message(error, "job.yaml")
        if path and isinstance(document, dict):
            # The change is named: the field itself, a parent (its rules or a required
            # child), a child, or a sibling a rule reports (minPause against interval).
            changed = _render(path)
            parent = _render(path[:-1])
            problems = error.problems
            assert any(
                (p.path and (changed.startswith(p.path) or p.path.startswith(parent)))
                or "nested more than" in p.message
                for p in problems
            ), (changed, problems)
    else:
        _check_usable(job)


@FUZZ
@given(text=hostile_yaml())
def test_run_on_any_file_starts_or_refuses_with_no_side_effect(text: str) -> None:
    try:
        job = parse_manifest(text, "job.yaml")
    except ManifestError as error:
        _check_message(error, "job.yaml")
    else:
        _check_usable(job)
        return  # a valid manifest would start a driver: `run` is only tried on rejections
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "job.yaml"
        path.write_text(text, encoding="utf-8")
        state = Path(directory) / "state"
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(["run", str(path), "--state-dir", str(state)])

        assert code == 2
        lines = stderr.getvalue().splitlines()
        assert lines, lines
        assert all(line.startswith(f"spark-checkpoint run: {path}: ") for line in lines), lines
        assert not state.exists()


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=300))
def test_arbitrary_text_never_raises_anything_but_a_manifest_error(text: str) -> None:
    try:
        _check_usable(parse_manifest(text, "job.yaml"))
    except ManifestError as error:
        _check_message(error, "job.yaml")


def test_the_fuzzed_documents_include_valid_ones() -> None:
    # The strategies must reach both outcomes, or the properties above test half.
    outcomes = set()

    @settings(max_examples=60, deadline=None, database=None, derandomize=True)
    @given(text=hostile_yaml())
    def observe(text: str) -> None:
        try:
            parse_manifest(text)
            outcomes.add("valid")
        except ManifestError:
            outcomes.add("rejected")

    observe()
    assert outcomes == {"valid", "rejected"}
