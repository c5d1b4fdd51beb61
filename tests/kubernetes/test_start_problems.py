"""What keeps a driver pod from starting, read from its status as a kubelet and the
scheduler write it (the operator tells the user, and fails the job when only a new spec
can help)."""

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.kubernetes.runtime import pod_start_problem
from spark_checkpoint_operator.manifest.loading import manifest_from_document
from spark_checkpoint_operator.manifest.validation import validate_document
from spark_checkpoint_operator.supervisor import StartProblem

FIXTURES = Path(__file__).parent.parent / "manifest" / "fixtures"


def _pod(status: dict[str, Any]) -> dict[str, Any]:
    document = validate_document(yaml.safe_load((FIXTURES / "minimal-job.yaml").read_text()))
    manifest = manifest_from_document(document)
    document["metadata"]["uid"] = "0b6c3a52-6f1d-4a57-9d0c-6c1b8f1d2e3f"
    pod = objects.driver_pod(
        manifest,
        document,
        attempt=1,
        storage="s3a://bucket/checkpoints",
        restore=[],
        deployed_hash="h",
        user_ids=objects.UserIds.IMAGE,
    )
    return pod | {"status": copy.deepcopy(status)}


def _waiting(reason: str, message: str = "", container: str = objects.DRIVER) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [
            {
                "name": container,
                "image": "example/orders:1",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ],
    }


UNSCHEDULABLE = {
    "phase": "Pending",
    "conditions": [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient memory.",
        }
    ],
}


@pytest.mark.parametrize(
    ("status", "problem"),
    [
        ({"phase": "Pending"}, None),  # not scheduled yet
        (_waiting("ContainerCreating"), None),
        (_waiting("PodInitializing"), None),
        (
            _waiting(
                "CreateContainerConfigError",
                "couldn't find key AWS_SECRET_ACCESS_KEY in Secret default/s3",
            ),
            StartProblem(
                "CreateContainerConfigError",
                "couldn't find key AWS_SECRET_ACCESS_KEY in Secret default/s3",
            ),
        ),
        (
            _waiting("ErrImagePull", 'failed to pull image "example/orders:1": not found'),
            StartProblem("ErrImagePull", 'failed to pull image "example/orders:1": not found'),
        ),
        (
            _waiting("ImagePullBackOff", 'Back-off pulling image "example/orders:1"'),
            StartProblem("ImagePullBackOff", 'Back-off pulling image "example/orders:1"'),
        ),
        (
            _waiting("InvalidImageName", 'Failed to apply default image tag "Orders:1"'),
            StartProblem("InvalidImageName", 'Failed to apply default image tag "Orders:1"'),
        ),
        (_waiting("ErrImageNeverPull"), StartProblem("ErrImageNeverPull", "")),
        # A sidecar an admission webhook added is not the driver.
        (_waiting("ImagePullBackOff", "mesh proxy", container="istio-proxy"), None),
        (
            _waiting("PodInitializing")
            | {
                "initContainerStatuses": [
                    {
                        "name": "istio-init",
                        "image": "mesh/proxy:1",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "waiting": {
                                "reason": "ImagePullBackOff",
                                "message": 'Back-off pulling image "mesh/proxy:1"',
                            }
                        },
                    }
                ]
            },
            # An init container a webhook added.
            StartProblem(
                "Init:ImagePullBackOff", 'istio-init: Back-off pulling image "mesh/proxy:1"'
            ),
        ),
        (
            UNSCHEDULABLE,
            StartProblem("Unschedulable", "0/3 nodes are available: 3 Insufficient memory."),
        ),
    ],
)
def test_what_keeps_the_driver_from_starting(
    status: dict[str, Any], problem: StartProblem | None
) -> None:
    assert pod_start_problem(_pod(status)) == problem


def test_a_problem_reads_as_reason_and_message() -> None:
    assert str(StartProblem("Unschedulable", "0/3 nodes are available.")) == (
        "Unschedulable: 0/3 nodes are available."
    )
    assert str(StartProblem("ErrImageNeverPull", "")) == "ErrImageNeverPull"
