"""The janitor's pods from the outside: the command line the operator puts into a cleanup or
check pod is the command the janitor in that pod parses; the check pod has what a Spark
session needs; its verdict is read back from the termination message, whatever the pod left
there (missing, cut, not JSON: no verdict, one line saying why, never a traceback)."""

import functools
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from helpers.job_pods import CHECKED_IMAGE, job_pods
from helpers.kube.kubelet import _expand as expand
from spark_checkpoint.janitor_commands import (
    JANITOR_MODULE,
    ClaimStorage,
    CollectGarbage,
    DiscardCheckpoint,
    DiscardSavepoint,
    JanitorCommand,
    RemoveLiveDirectory,
    VerifyRestorable,
    parse,
)
from spark_checkpoint.restorable_report import (
    ImageVerdict,
    encoded,
    fitted,
    parse_image,
)
from spark_checkpoint.settings import TERMINATION_MESSAGE_BYTES
from spark_checkpoint.storage import CheckpointKind
from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.kubernetes.runtime import (
    pod_exit_code,
    pod_failure_message,
    restorable_verdict,
)
from spark_checkpoint_operator.manifest.loading import manifest_from_document
from spark_checkpoint_operator.manifest.validation import validate_document
from spark_checkpoint_operator.supervisor import CheckUnavailable

FIXTURES = Path(__file__).parent.parent / "manifest" / "fixtures"
SPARK_REASON = (
    "state of operator 0, store default: [CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] An error "
    "occurred during loading state. SQLSTATE: 58030"
)


@functools.cache
def _job() -> tuple[Any, dict[str, Any]]:
    document = validate_document(yaml.safe_load((FIXTURES / "full-job.yaml").read_text()))
    manifest = manifest_from_document(document)
    document["metadata"]["uid"] = "0b6c3a52-6f1d-4a57-9d0c-6c1b8f1d2e3f"
    return manifest, document


def _pod_of(command: JanitorCommand) -> dict[str, Any]:
    manifest, document = _job()
    if isinstance(command, VerifyRestorable):
        return objects.check_pod(
            manifest,
            document,
            storage="s3a://b/c",
            image=command.image,
            user_ids=objects.UserIds.IMAGE,
        )
    return objects.cleanup_pod(
        manifest, document, storage="s3a://b/c", command=command, user_ids=objects.UserIds.IMAGE
    )


# What fits on a command line: no NUL, no lone surrogates.
_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"))
_ids = st.lists(st.integers(0, 10**15), max_size=5).map(tuple)
_images = st.builds(
    "{}:{}".format, st.sampled_from(["checkpoint", "savepoint"]), st.integers(0, 10**15)
)
_commands = st.one_of(
    st.builds(DiscardCheckpoint, st.integers(0, 10**15), _ids),
    st.builds(DiscardSavepoint, st.integers(0, 10**15)),
    st.builds(CollectGarbage, _ids, _ids),
    st.just(ClaimStorage()),
    st.builds(
        RemoveLiveDirectory,
        _text.filter(lambda name: name not in ("", ".", "..") and "/" not in name),
    ),
    st.builds(VerifyRestorable, _images, st.just(objects.TERMINATION_MESSAGE_PATH)),
)


@settings(deadline=None)  # the first example loads the manifest
@given(_commands)
@example(RemoveLiveDirectory("-h"))  # a name that looks like an option stays a name
@example(RemoveLiveDirectory("$(POD_NAME)$$"))  # the kubelet's expansion leaves it as is
def test_the_janitor_parses_the_command_the_operator_put_into_its_pod(
    command: JanitorCommand,
) -> None:
    # As the container gets it: the kubelet turns the operator's "$$" back into "$".
    line = [expand(word, {}) for word in _pod_of(command)["spec"]["containers"][0]["command"]]

    assert line[:3] == ["python", "-m", JANITOR_MODULE]
    assert parse(line[3:]) == command


def test_the_check_pod_has_the_drivers_resources_and_reports_in_its_termination_message() -> None:
    manifest, document = _job()
    pods = job_pods(manifest, document)
    driver, check = pods["driver"], pods[objects.CHECK]

    kubernetes_validate.validate(check, "1.30", strict=True)
    (container,) = check["spec"]["containers"]
    assert container["resources"] == driver["spec"]["containers"][0]["resources"]
    environment = {e["name"]: e.get("value") for e in container["env"]}
    heap = f"spark.driver.memory={manifest.spec.driver.memory_mib}m"
    assert heap in environment["PYSPARK_SUBMIT_ARGS"], "the JVM may use what the pod has"
    assert environment["SPARK_CHECKPOINT_STORAGE"] == "s3a://b/c"
    assert parse(container["command"][3:]) == VerifyRestorable(
        CHECKED_IMAGE, report=container["terminationMessagePath"]
    )
    labels = check["metadata"]["labels"]
    assert labels[objects.LABEL_COMPONENT] == objects.CHECK != objects.CLEANUP, (
        "the launcher deletes cleanup pods before a driver starts, never a check under way"
    )
    assert check["spec"]["serviceAccountName"] == driver["spec"]["serviceAccountName"]


def _ended(message: str | None, exit_code: int = 0) -> dict[str, Any]:
    terminated: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": "Completed" if exit_code == 0 else "Error",
    }
    if message is not None:
        terminated["message"] = message
    return {
        "metadata": {"name": "orders-check-x1", "labels": {objects.LABEL_COMPONENT: objects.CHECK}},
        "status": {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [{"name": "check", "state": {"terminated": terminated}}],
        },
    }


def _with_sidecar(pod: dict[str, Any], sidecar_state: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as a service mesh's webhook leaves it: its proxy listed first and, while the
    proxy runs, the pod Running though our container ended."""
    status = pod["status"]
    proxy = {"name": "istio-proxy", "state": sidecar_state}
    phase = "Running" if "running" in sidecar_state else status["phase"]
    return {
        **pod,
        "status": {
            **status,
            "phase": phase,
            "containerStatuses": [proxy, *status["containerStatuses"]],
        },
    }


@pytest.mark.parametrize("exit_code", [0, 3])
def test_a_pod_is_judged_by_its_own_container_not_an_injected_sidecar(exit_code: int) -> None:
    """A sidecar that is not a native one keeps the pod Running after our container
    exited: judging the phase kept a cleanup pod waiting for its 600 s timeout."""
    ended = _ended(_report("checkpoint:7", []), exit_code)
    running_proxy = _with_sidecar(ended, {"running": {"startedAt": "2026-11-27T08:00:00Z"}})
    assert pod_exit_code(running_proxy) == exit_code
    killed_proxy = _with_sidecar(ended, {"terminated": {"exitCode": 137, "reason": "Error"}})
    assert pod_exit_code(killed_proxy) == exit_code
    if exit_code == 0:
        assert restorable_verdict(running_proxy, "checkpoint:7") == []
    else:
        assert "exit code 3 (Error)" in pod_failure_message(killed_proxy)


def test_a_pod_whose_own_container_runs_has_not_ended_whatever_its_sidecar_does() -> None:
    pod = _ended(None)
    pod["status"]["containerStatuses"][0]["state"] = {"running": {}}
    pod["status"]["phase"] = "Running"
    assert pod_exit_code(_with_sidecar(pod, {"terminated": {"exitCode": 0}})) is None


def _report(image: str, problems: list[str]) -> str:
    return fitted(ImageVerdict(*parse_image(image), tuple(problems)))


def test_the_verdict_is_read_from_the_termination_message() -> None:
    assert restorable_verdict(_ended(_report("checkpoint:7", [])), "checkpoint:7") == []
    found = restorable_verdict(_ended(_report("checkpoint:7", [SPARK_REASON])), "checkpoint:7")
    assert found == [SPARK_REASON]


REPORT = _report("checkpoint:7", [SPARK_REASON])


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        (_ended(None), "its termination message is empty"),
        (_ended(""), "its termination message is empty"),
        (_ended(REPORT[: len(REPORT) // 2]), 'is not a report: {"snapshots"'),
        (_ended("Traceback (most recent call last):\n  ...\nKeyError: 'x'"), "not a report"),
        (_ended(json.dumps({"snapshots": "none"})), "not a report"),
        (_ended(json.dumps({"snapshots": [{"kind": "checkpoint"}]})), "not a report"),
        (
            _ended(json.dumps({"snapshots": [{"kind": "checkpoint", "id": 7, "problems": "x"}]})),
            "the problems of checkpoint:7 are not a list of text",
        ),
        (_ended(json.dumps([1, 2])), "not a report"),
        (
            _ended(json.dumps({"snapshots": [{"kind": "x", "id": 7, "problems": []}]})),
            "not a report: 'x:7'",
        ),
        (_ended(_report("checkpoint:6", [])), "reported on checkpoint:6, not on checkpoint:7"),
        (
            _ended("java.lang.OutOfMemoryError: Java heap space\n", exit_code=1),
            "failed: exit code 1 (Error): java.lang.OutOfMemoryError: Java heap space",
        ),
        (
            {"metadata": {"name": "orders-check-x1"}, "status": {"phase": "Failed"}},
            "failed: no container status",
        ),
    ],
)
def test_without_a_readable_report_there_is_no_verdict_and_one_line_says_why(
    pod: dict[str, Any], reason: str
) -> None:
    with pytest.raises(CheckUnavailable) as raised:
        restorable_verdict(pod, "checkpoint:7")

    message = str(raised.value)
    assert message.startswith("check pod orders-check-x1 "), message
    assert reason in message
    assert "\n" not in message and len(message) < 400


@given(
    st.lists(_text | st.text('\u00e9\u2603"x', max_size=700), max_size=30), st.integers(0, 10**15)
)
@example([SPARK_REASON * 4] * 20, 7)  # many stores, each unreadable
@example(["\u2603" * 5000], 7)  # one problem alone too long
def test_any_report_fits_the_termination_message_and_keeps_its_verdict(
    problems: list[str], snapshot_id: int
) -> None:
    image = f"savepoint:{snapshot_id}"
    message = _report(image, problems)

    assert len(message.encode()) <= TERMINATION_MESSAGE_BYTES
    found = restorable_verdict(_ended(message), image)
    assert bool(found) == bool(problems), "never restorable by being cut"
    whole = encoded([ImageVerdict(CheckpointKind.SAVEPOINT, snapshot_id, tuple(problems))])
    if len(whole.encode()) <= TERMINATION_MESSAGE_BYTES:
        assert found == problems
    else:
        assert found[-1].endswith("(the check pod's log has them all)") or found[0].endswith(
            "... (cut)"
        )
        kept = [p for p in found if not p.startswith("... and ")]
        assert kept[:-1] == problems[: len(kept) - 1], "the first problems stay whole, in order"


@given(st.binary(max_size=TERMINATION_MESSAGE_BYTES))
def test_whatever_bytes_the_message_holds_there_is_a_verdict_or_one_line(data: bytes) -> None:
    try:
        found = restorable_verdict(_ended(data.decode(errors="replace")), "checkpoint:7")
    except CheckUnavailable as error:
        assert "\n" not in str(error)
    else:
        assert all(isinstance(problem, str) for problem in found)
