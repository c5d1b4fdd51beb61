"""Pod templates (spec.podTemplate, spec.driver.podTemplate, spec.executor.podTemplate):
what the job's pods are built over, what the operator's own settings win over, and what a
template may not say."""

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.doc_blocks import marked_blocks
from helpers.job_pods import job_pods
from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.kubernetes.runtime import pod_spec_problems, typed_object_problems
from spark_checkpoint_operator.manifest.loading import manifest_from_document
from spark_checkpoint_operator.manifest.model import JobManifest
from spark_checkpoint_operator.manifest.problems import ManifestError
from spark_checkpoint_operator.manifest.validation import validate_document

FIXTURES = Path(__file__).parent.parent / "manifest" / "fixtures"
KUBERNETES_VERSION = "1.30"
MAIN = "spark-main-container"
UID = "0b6c3a52-6f1d-4a57-9d0c-6c1b8f1d2e3f"

COMMON = {
    "metadata": {"labels": {"team": "payments", "tier": "common"}},
    "spec": {
        "priorityClassName": "streaming",
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "zone", "operator": "In", "values": ["a", "b"]}
                            ]
                        }
                    ]
                }
            }
        },
        "tolerations": [{"key": "spot", "operator": "Exists"}],
        "containers": [
            {
                "name": MAIN,
                "resources": {"limits": {"ephemeral-storage": "2Gi"}},
                "volumeMounts": [{"name": "logs", "mountPath": "/var/log/app"}],
                "env": [{"name": "TZ", "value": "UTC"}],
            },
            {
                "name": "log-shipper",
                "image": "fluent/fluent-bit:3.1",
                "volumeMounts": [{"name": "logs", "mountPath": "/logs", "readOnly": True}],
            },
        ],
        "volumes": [{"name": "logs", "emptyDir": {"sizeLimit": 1073741824}}],
    },
}
DRIVER = {
    "metadata": {"labels": {"tier": "driver"}, "annotations": {"example.com/owner": "x"}},
    "spec": {
        "priorityClassName": "streaming-critical",
        "initContainers": [
            {"name": "wait-for-kafka", "image": "busybox:1.36", "command": ["true"]}
        ],
        "containers": [{"name": "log-shipper", "args": ["--driver"]}],
    },
}
EXECUTOR = {
    "spec": {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
            }
        ]
    }
}


def _document(
    common: Any = COMMON, driver: Any = DRIVER, executor: Any = EXECUTOR
) -> dict[str, Any]:
    raw = yaml.safe_load((FIXTURES / "full-job.yaml").read_text())
    raw["spec"]["podTemplate"] = copy.deepcopy(common)
    raw["spec"]["driver"]["podTemplate"] = copy.deepcopy(driver)
    raw["spec"]["executor"]["podTemplate"] = copy.deepcopy(executor)
    return raw


def _job(**templates: Any) -> tuple[JobManifest, dict[str, Any]]:
    document = validate_document(_document(**templates))
    document["metadata"]["uid"] = UID
    return manifest_from_document(document), document


def _driver_pod(manifest: JobManifest, document: dict[str, Any]) -> dict[str, Any]:
    return job_pods(manifest, document)["driver"]


def test_the_driver_pod_is_built_over_the_common_and_the_drivers_template() -> None:
    manifest, document = _job()
    plain, _ = _job(common={}, driver={}, executor={})
    pod = _driver_pod(manifest, document)
    own = _driver_pod(plain, document)

    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    # The pod's own container first (`kubectl logs` shows it), then the sidecar.
    assert [c["name"] for c in pod["spec"]["containers"]] == ["driver", "log-shipper"]
    driver, shipper = pod["spec"]["containers"]
    # The operator's settings win: command, image, cpu and memory, its security context.
    own_driver = own["spec"]["containers"][0]
    for key in ("command", "image", "securityContext", "ports", "terminationMessagePolicy"):
        assert driver[key] == own_driver[key], key
    assert driver["resources"]["limits"] == {
        **own_driver["resources"]["limits"],
        "ephemeral-storage": "2Gi",
    }
    # The template's lists come first, the operator's after (its variables win).
    assert driver["env"] == [{"name": "TZ", "value": "UTC"}, *own_driver["env"]]
    assert driver["volumeMounts"] == [
        {"name": "logs", "mountPath": "/var/log/app"},
        *own_driver["volumeMounts"],
    ]
    # The role's template over the common one: merged by name, scalars replaced.
    assert shipper["image"] == "fluent/fluent-bit:3.1"
    assert shipper["args"] == ["--driver"]
    assert pod["spec"]["priorityClassName"] == "streaming-critical"
    assert pod["spec"]["initContainers"][0]["name"] == "wait-for-kafka"
    assert pod["spec"]["affinity"] == COMMON["spec"]["affinity"]
    assert pod["spec"]["tolerations"] == [
        {"key": "spot", "operator": "Exists"},
        *own["spec"]["tolerations"],
    ]
    assert pod["spec"]["volumes"] == [
        {"name": "logs", "emptyDir": {"sizeLimit": "1073741824"}},
        *own["spec"]["volumes"],
    ]
    for key in ("restartPolicy", "securityContext", "serviceAccountName", "nodeSelector"):
        assert pod["spec"][key] == own["spec"][key], key
    labels = pod["metadata"]["labels"]
    assert labels == {"team": "payments", "tier": "driver", **own["metadata"]["labels"]}
    annotations = pod["metadata"]["annotations"]
    assert annotations.pop(objects.ANNOTATION_EXECUTOR_TEMPLATE)  # the next test's
    own["metadata"]["annotations"].pop(objects.ANNOTATION_EXECUTOR_TEMPLATE)
    assert annotations == {"example.com/owner": "x", **own["metadata"]["annotations"]}


def test_cleanup_and_check_pods_take_the_drivers_template() -> None:
    """They run as the driver does (its credentials, its nodes); a sidecar does not keep
    them from ending: the operator reads their own container and deletes them."""
    manifest, document = _job()
    pods = job_pods(manifest, document)
    cleanup, check = pods[objects.CLEANUP], pods[objects.CHECK]

    for pod, component in ((cleanup, objects.CLEANUP), (check, objects.CHECK)):
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
        assert [c["name"] for c in pod["spec"]["containers"]] == [component, "log-shipper"]
        assert pod["spec"]["priorityClassName"] == "streaming-critical"
        assert pod["spec"]["initContainers"][0]["name"] == "wait-for-kafka"
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert pod["metadata"]["labels"]["tier"] == "driver"
        own = pod["spec"]["containers"][0]
        assert own["resources"]["limits"]["ephemeral-storage"] == "2Gi"
        assert own["command"][:3] == ["python", "-m", "spark_checkpoint.janitor"]


def test_the_executors_template_is_built_over_the_common_and_the_executors_template() -> None:
    manifest, document = _job()
    template = objects.executor_pod_template(manifest, objects.UserIds.IMAGE)
    pod = _driver_pod(manifest, document)

    assert json.loads(pod["metadata"]["annotations"][objects.ANNOTATION_EXECUTOR_TEMPLATE]) == (
        template
    )
    kubernetes_validate.validate(template, KUBERNETES_VERSION, strict=True)
    spark, shipper = template["spec"]["containers"]
    assert spark["name"] == objects.EXECUTOR_CONTAINER
    assert spark["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert spark["resources"] == {"limits": {"ephemeral-storage": "2Gi"}}
    assert spark["volumeMounts"] == [
        {"name": "logs", "mountPath": "/var/log/app"},
        {"name": "scratch", "mountPath": "/scratch"},
    ]
    assert "args" not in shipper  # the driver's template's, not the executors'
    assert template["spec"]["priorityClassName"] == "streaming"
    assert template["spec"]["topologySpreadConstraints"][0]["maxSkew"] == 1
    assert "initContainers" not in template["spec"]
    assert template["metadata"]["labels"] == {"team": "payments", "tier": "common"}


def test_a_pod_template_is_part_of_the_deployment_and_none_leaves_the_hash_alone() -> None:
    with_templates = _document()
    without = _document(common={}, driver={}, executor={})
    for spec in (with_templates["spec"], without["spec"]):
        spec["podTemplate"] or spec.pop("podTemplate")
    unset = copy.deepcopy(without)
    for role in ("driver", "executor"):
        del unset["spec"][role]["podTemplate"]

    hashes = {objects.deployment_hash(document["spec"]) for document in (with_templates, without)}
    assert len(hashes) == 2
    changed = copy.deepcopy(with_templates)
    changed["spec"]["podTemplate"]["spec"]["priorityClassName"] = "other"
    assert objects.deployment_hash(changed["spec"]) not in hashes
    # Empty templates are no change: a job's hash stays what it was.
    assert objects.deployment_hash(without["spec"]) == objects.deployment_hash(unset["spec"])


def _problems(**templates: Any) -> list[str]:
    manifest, _ = _job(**templates)
    return pod_spec_problems(manifest)


def _with(template: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {**template, "spec": {**template.get("spec", {}), **spec}}


@pytest.mark.parametrize(
    ("templates", "problem"),
    [
        (
            {"driver": {"spec": {"containers": [{"name": "driver", "image": "x"}]}}},
            "spec.driver.podTemplate.spec.containers[0].name: 'driver' is what the operator "
            "names a pod's own container: a pod template names it spark-main-container",
        ),
        (
            {"executor": {"spec": {"containers": [{"name": "spark-kubernetes-executor"}]}}},
            "spec.executor.podTemplate.spec.containers[0].name: 'spark-kubernetes-executor' "
            "is what the operator names a pod's own container: a pod template names it "
            "spark-main-container",
        ),
        (
            {"driver": {"spec": {"containers": [{"name": MAIN, "args": ["--x"]}]}}},
            "spec.driver.podTemplate.spec.containers[0].args: set by the operator from "
            "spec.application",
        ),
        (
            {"executor": {"spec": {"containers": [{"name": MAIN, "image": "other:1"}]}}},
            "spec.executor.podTemplate.spec.containers[0].image: set by the operator from "
            "spec.image",
        ),
        (
            {"driver": {"spec": {"initContainers": [{"name": MAIN, "image": "x"}]}}},
            "spec.driver.podTemplate.spec.initContainers[0].name: spark-main-container is "
            "the pod's own container, not an init container",
        ),
        (
            {
                "driver": {
                    "spec": {
                        "containers": [{"name": "a", "image": "x"}],
                        "initContainers": [{"name": "a", "image": "x"}],
                    }
                }
            },
            "spec.driver.podTemplate.spec.initContainers[0].name: the driver pods would have "
            "two containers named 'a'",
        ),
        (
            {"common": {"metadata": {"labels": {"sparkcheckpoint.io/job": "other"}}}},
            "spec.podTemplate.metadata.labels: 'sparkcheckpoint.io/job' is a label the "
            "operator sets",
        ),
        (
            {"executor": {"metadata": {"labels": {"spark-role": "driver"}}}},
            "spec.executor.podTemplate.metadata.labels: 'spark-role' is a label the operator sets",
        ),
        (
            {
                "driver": {
                    "metadata": {"annotations": {"sparkcheckpoint.io/deployment-hash": "0" * 16}}
                }
            },
            "spec.driver.podTemplate.metadata.annotations: 'sparkcheckpoint.io/deployment-"
            "hash' is an annotation the operator sets",
        ),
        (
            {
                "executor": {
                    "spec": {
                        "containers": [{"name": MAIN, "securityContext": {"privileged": True}}]
                    }
                }
            },
            "spec.executor.podTemplate.spec.containers[0].securityContext.privileged: not in "
            "the operator's restricted security context (a template may add "
            "readOnlyRootFilesystem, runAsGroup, runAsUser)",
        ),
        (
            {"common": {"spec": {"securityContext": {"runAsUser": 0}}}},
            "spec.podTemplate.spec.securityContext.runAsUser: the job's pods run as a "
            "non-root user",
        ),
        (
            {"driver": {"metadata": {"labels": {"-bad": "x"}}}},
            "spec.driver.podTemplate.metadata.labels: '-bad' is not a label or annotation key "
            "(an optional DNS subdomain and '/', then at most 63 letters, digits, '-', '_' "
            "and '.', starting and ending with a letter or digit)",
        ),
        (
            {"driver": {"spec": {"volumes": [{"name": "agent-token", "emptyDir": {}}]}}},
            "spec.driver.podTemplate.spec.volumes[0].name: 'agent-token' is a volume the "
            "operator or Spark adds",
        ),
        (
            {"common": _with(COMMON, volumes=[])},
            "spec.podTemplate.spec.containers[0].volumeMounts[0].name: 'logs' is not in "
            "spec.driver.volumes nor spec.podTemplate.spec.volumes nor "
            "spec.driver.podTemplate.spec.volumes",
        ),
        (
            {
                "executor": {
                    "spec": {
                        "containers": [
                            {
                                "name": "peek",
                                "image": "x",
                                "volumeMounts": [{"name": "checkpoint-work", "mountPath": "/w"}],
                            }
                        ]
                    }
                },
                "driver": {
                    "spec": {
                        "containers": [
                            {
                                "name": "peek",
                                "image": "x",
                                "volumeMounts": [{"name": "agent-token", "mountPath": "/t"}],
                            }
                        ]
                    }
                },
            },
            "spec.driver.podTemplate.spec.containers[0].volumeMounts[0].name: 'agent-token' "
            "is a volume the operator adds to the driver pod alone (the job's cleanup and "
            "check pods, which take the driver's volumes and mounts, have none of that name)",
        ),
        (
            {
                "common": {
                    "spec": {
                        "containers": [
                            {
                                "name": MAIN,
                                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                            }
                        ],
                    }
                },
                "driver": {},
            },
            "spec.podTemplate.spec.containers[0].volumeMounts[0].mountPath: '/scratch' "
            "mounts two volumes",
        ),
        (
            {
                "driver": {
                    "spec": {
                        "containers": [
                            {
                                "name": MAIN,
                                "volumeMounts": [
                                    {"name": "logs", "mountPath": "/var/run/spark-checkpoint/x"}
                                ],
                            }
                        ]
                    }
                }
            },
            "spec.driver.podTemplate.spec.containers[0].volumeMounts[0].mountPath: "
            "'/var/run/spark-checkpoint/x' is where the operator or Spark mounts "
            "(/var/run/spark-checkpoint), or inside it",
        ),
        (
            {"common": _with(COMMON, tolerations=[{"key": "k", "tolerationSeconds": "5"}])},
            "spec.podTemplate.spec.tolerations[0].tolerationSeconds: Input should be a valid "
            "integer",
        ),
        (
            {"executor": {"spec": {"nodeSelecter": {"pool": "x"}}}},
            "spec.executor.podTemplate.spec.nodeSelecter: unknown field (did you mean "
            "nodeSelector?)",
        ),
        (
            # A typo deeper down is named with the closest field of its own object.
            {"driver": {"spec": {"containers": [{"name": "x", "imagePullPolicyy": "Always"}]}}},
            "spec.driver.podTemplate.spec.containers[0].imagePullPolicyy: unknown field (did "
            "you mean imagePullPolicy?)",
        ),
        (
            {
                "driver": {
                    "spec": {"containers": [{"name": "x", "ports": [{"containerPort": "80"}]}]}
                }
            },
            "spec.driver.podTemplate.spec.containers[0].ports[0].containerPort: Input should "
            "be a valid integer",
        ),
        (
            {"driver": {"spec": {"containers": [{"image": "x"}]}}},
            "spec.driver.podTemplate.spec.containers[0].name: Field required",
        ),
        (
            {"driver": {"spec": {"containers": "log-shipper"}}},
            "spec.driver.podTemplate.spec.containers: Input should be a valid list",
        ),
        (
            {
                "executor": {
                    "spec": {"containers": [{"name": MAIN, "resources": {"limits": {"cpu": "a"}}}]}
                }
            },
            "spec.executor.podTemplate.spec.containers[0].resources.limits.cpu: 'a' is not a "
            "quantity such as 1Gi, 500M or 0.5",
        ),
        # A reviewer's (helper-162): each built a pod the API server refuses, or one that
        # undoes what the operator's pods promise.
        (
            {"common": {"spec": {"serviceAccountName": "spark-checkpoint-operator"}}},
            "spec.podTemplate.spec.serviceAccountName: set by spec.driver.serviceAccount and "
            "spec.executor.serviceAccount",
        ),
        (
            {"driver": {"spec": {"hostNetwork": True}}},
            "spec.driver.podTemplate.spec.hostNetwork: the job's pods run in their own "
            "network namespace",
        ),
        (
            {"driver": {"spec": {"ephemeralContainers": [{"name": "debug", "image": "x"}]}}},
            "spec.driver.podTemplate.spec.ephemeralContainers: the API server takes none as "
            "a pod is created",
        ),
        (
            {
                "driver": {
                    "spec": {
                        "containers": [{"name": MAIN, "resources": {"limits": {"cpu": "100m"}}}]
                    }
                }
            },
            "spec.driver.podTemplate.spec.containers[0].resources.limits.cpu: set by the "
            "operator from the role's cores and memory (spec.driver, spec.executor)",
        ),
        (
            {
                "driver": {
                    "spec": {
                        "containers": [
                            {"name": MAIN, "ports": [{"name": "agent", "containerPort": 9000}]}
                        ]
                    }
                }
            },
            "spec.driver.podTemplate.spec.containers[0].ports[0]: 'agent' (9000) is a port the "
            "operator or Spark gives the pod's own container",
        ),
        (
            {
                "driver": {
                    "spec": {"containers": [{"name": MAIN, "terminationMessagePath": "/tmp/m"}]}
                }
            },
            "spec.driver.podTemplate.spec.containers[0].terminationMessagePath: set by the "
            "operator (where the driver reports its error)",
        ),
        (
            {
                "executor": {
                    "spec": {
                        "containers": [
                            {
                                "name": MAIN,
                                "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
                            }
                        ]
                    }
                }
            },
            "spec.executor.podTemplate.spec.containers[0].securityContext.capabilities: set by "
            "the operator ({'drop': ['ALL']})",
        ),
        (
            {"common": {"spec": {"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}}},
            "spec.podTemplate.spec.securityContext.appArmorProfile: not in the operator's "
            "restricted security context (a template may add fsGroup, fsGroupChangePolicy, "
            "runAsGroup, runAsUser, supplementalGroups, supplementalGroupsPolicy, sysctls)",
        ),
        (
            {
                "common": {"spec": {"containers": [{"name": "x", "image": "b"}]}},
                "executor": {"spec": {"initContainers": [{"name": "x", "image": "b"}]}},
            },
            "spec.executor.podTemplate.spec.initContainers[0].name: the executor pods would "
            "have two containers named 'x'",
        ),
        (
            {
                "common": {
                    "spec": {
                        "containers": [
                            {
                                "name": "s",
                                "image": "b",
                                "ports": [{"name": "http", "containerPort": 2020}],
                            }
                        ]
                    }
                },
                "driver": {
                    "spec": {
                        "containers": [
                            {"name": "s", "ports": [{"name": "http", "containerPort": 2021}]}
                        ]
                    }
                },
            },
            "spec.driver.podTemplate.spec.containers[0].ports[0].name: 'http' is in two ports "
            "of the driver pods' 's'",
        ),
        (
            {
                "common": _with(
                    COMMON,
                    containers=[
                        {
                            "name": "s",
                            "image": "b",
                            "volumeMounts": [{"name": "logs", "mountPath": "/x"}],
                        }
                    ],
                ),
                "driver": {
                    "spec": {
                        "containers": [
                            {"name": "s", "volumeMounts": [{"name": "logs", "mountPath": "/x/"}]}
                        ]
                    }
                },
            },
            "spec.driver.podTemplate.spec.containers[0].volumeMounts[0].mountPath: '/x/' is in "
            "two volumeMounts of the driver pods' 's'",
        ),
        (
            {"driver": {"spec": {"containers": [{"name": MAIN, "restartPolicy": "Always"}]}}},
            "spec.driver.podTemplate.spec.containers[0].restartPolicy: only an init container "
            "may have one",
        ),
        (
            {
                "driver": {
                    "spec": {
                        "containers": [
                            {
                                "name": "s",
                                "image": "b",
                                "env": [
                                    {
                                        "name": "A",
                                        "value": "1",
                                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                                    }
                                ],
                            }
                        ]
                    }
                }
            },
            "spec.driver.podTemplate.spec.containers[0].env[0]: a value and a valueFrom (one "
            "of them)",
        ),
        (
            {"driver": {"spec": {"containers": [{"name": "s", "image": ""}]}}},
            "spec.driver.podTemplate.spec.containers[0].image: required for 's' (only the pod's "
            "own container has the job's)",
        ),
        # A newcomer's (helper-163): each passed, and a cluster would refuse the pod or
        # the kubelet never start it; or the pod was not what the template said.
        (
            {"common": {"spec": {"volumes": [{"name": "Logs_Volume", "emptyDir": {}}]}}},
            "spec.podTemplate.spec.volumes[0].name: 'Logs_Volume' is not a DNS-1123 label "
            "(lowercase letters, digits and '-', starting and ending with a letter or digit)",
        ),
        (
            {
                "driver": {
                    "spec": {
                        "containers": [
                            {"name": MAIN, "resources": {"requests": {"nvidia.com/gpu": 1}}}
                        ]
                    }
                }
            },
            "spec.driver.podTemplate.spec.containers[0].resources.requests.nvidia.com/gpu: "
            "needs a limit of the same amount (Kubernetes does not overcommit it)",
        ),
        (
            {
                "executor": {
                    "spec": {
                        "containers": [
                            {"name": MAIN, "resources": {"requests": {"hugepages-2Mi": "64Mi"}}}
                        ]
                    }
                }
            },
            "spec.executor.podTemplate.spec.containers[0].resources.requests.hugepages-2Mi: "
            "needs a limit of the same amount (Kubernetes does not overcommit it)",
        ),
        (
            {
                "driver": {
                    "spec": {
                        "containers": [
                            {"name": "s", "image": "b", "securityContext": {"runAsUser": 0}}
                        ]
                    }
                }
            },
            "spec.driver.podTemplate.spec.containers[0].securityContext.runAsUser: the job's "
            "pods run as a non-root user",
        ),
        (
            {
                "executor": {
                    "spec": {
                        "initContainers": [
                            {"name": "s", "image": "b", "securityContext": {"privileged": True}}
                        ]
                    }
                }
            },
            "spec.executor.podTemplate.spec.initContainers[0].securityContext.privileged: the "
            "job's pods run unprivileged",
        ),
        (
            {
                "driver": {
                    "spec": {
                        "containers": [{"name": MAIN, "env": [{"name": "POD_NAME", "value": "x"}]}]
                    }
                }
            },
            "spec.driver.podTemplate.spec.containers[0].env[0].name: is set by the operator "
            "itself (reserved: SPARK_CHECKPOINT_* variables, PYSPARK_SUBMIT_ARGS (set Spark "
            "options in sparkConf), PYSPARK_GATEWAY_PORT, PYSPARK_GATEWAY_SECRET, POD_NAME, "
            "POD_NAMESPACE and POD_IP)",
        ),
        (
            {"common": {"spec": {"containers": [{"name": "flink-main-container"}]}}},
            "spec.podTemplate.spec.containers[0].name: flink-main-container is Flink's name "
            "of the pod's own container: here it is spark-main-container",
        ),
        (
            {"driver": {"spec": {"terminationGracePeriodSeconds": 5}}},
            "spec.driver.podTemplate.spec.terminationGracePeriodSeconds: set by the operator "
            "(the time a driver has to stop)",
        ),
        (
            {"common": {"spec": {"restartPolicy": "Always"}}},
            "spec.podTemplate.spec.restartPolicy: set by the operator (Never: the operator "
            "restarts a driver)",
        ),
        # A name the CRD cannot check the type of: the typed check's, and no traceback.
        (
            {"driver": {"spec": {"containers": [{"name": {"a": 1}, "image": "x"}]}}},
            "spec.driver.podTemplate.spec.containers[0].name: Input should be a valid string",
        ),
    ],
)
def test_what_a_pod_template_may_not_say_is_a_problem_naming_its_field(
    templates: dict[str, Any], problem: str
) -> None:
    found = _problems(**templates)
    assert problem in found, found


def test_the_example_templates_are_no_problem() -> None:
    assert _problems() == []
    # The same volume in both templates is one volume (a reviewer's: it was two).
    logs = COMMON["spec"]["volumes"]
    assert _problems(driver=_with(DRIVER, volumes=logs)) == []
    # A sidecar's own context, and a user that is not root, are the template's to say.
    sidecar = {
        "name": "probe",
        "image": "x",
        "securityContext": {"runAsUser": 1000, "capabilities": {"add": ["NET_BIND_SERVICE"]}},
    }
    user = {"securityContext": {"runAsUser": 1000, "runAsGroup": 1000}}
    assert _problems(driver={"spec": {"containers": [sidecar], **user}}) == []
    # Quantities written as numbers, as the API server takes them.
    number = {
        "spec": {"containers": [{"name": MAIN, "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
    }
    assert _problems(executor=number) == []
    # A request and a limit of one amount, spelled two ways (a reviewer's).
    gpu = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1000m"}}
    spelled = {"spec": {"containers": [{"name": MAIN, "resources": gpu}]}}
    assert _problems(executor=spelled) == []


def test_an_executor_template_with_sparks_own_template_file_is_a_problem() -> None:
    raw = _document()
    raw["spec"]["application"]["sparkConf"] = {
        "spark.kubernetes.executor.podTemplateFile": "/opt/t.yaml"
    }
    for role in ("driver", "executor"):
        for field in ("tolerations", "volumes", "volumeMounts"):
            raw["spec"][role].pop(field, None)
    raw["spec"]["driver"]["podTemplate"] = {}
    raw["spec"]["podTemplate"]["spec"]["containers"][0].pop("volumeMounts")
    raw["spec"]["podTemplate"]["spec"]["containers"].pop(1)
    problems = pod_spec_problems(manifest_from_document(validate_document(raw)))

    setting = "spark.kubernetes.executor.podTemplateFile"
    assert problems == [
        f"spec.podTemplate: not applied to the executors with sparkConf {setting}, whose "
        "template replaces the operator's: put it in spec.driver.podTemplate and that template",
        f"spec.executor.podTemplate: not applied to the executors with sparkConf {setting}, "
        "whose template replaces the operator's",
    ]


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ({"apiVersion": "v2"}, "spec.podTemplate.apiVersion"),
        ({"kind": "Deployment"}, "spec.podTemplate.kind"),
        ({"metadata": {"name": "x"}}, "spec.podTemplate.metadata"),
        ({"spec": []}, "spec.podTemplate.spec"),
        ({"template": {}}, "spec.podTemplate"),
    ],
)
def test_a_pod_templates_frame_is_checked_by_the_schema(template: Any, field: str) -> None:
    with pytest.raises(ManifestError) as error:
        validate_document(_document(common=template))
    assert field in str(error.value)


def test_a_pods_manifest_is_a_template() -> None:
    """kind: Pod and apiVersion: v1, as a Flink user's template has them."""
    template = {"apiVersion": "v1", "kind": "Pod", **COMMON}
    manifest, document = _job(common=template)
    assert pod_spec_problems(manifest) == []
    kubernetes_validate.validate(_driver_pod(manifest, document), KUBERNETES_VERSION, strict=True)


def test_typed_problems_of_templates_are_the_pod_specs_only() -> None:
    manifest, _ = _job()
    assert typed_object_problems(manifest) == []


def test_the_templates_annotations_count_toward_the_pods_limit() -> None:
    big = {"metadata": {"annotations": {"note": "x" * objects.MAX_ANNOTATION_BYTES}}}
    problems = _problems(driver=big, executor=big)

    assert any(
        p.startswith("spec.driver.annotations: the driver pod's annotations would take")
        and "of them these and its pod templates'," in p
        for p in problems
    ), problems
    assert any(p.startswith("spec.executor.annotations: ") for p in problems), problems


def test_the_documented_templates_build_the_pods_they_describe() -> None:
    (example,) = marked_blocks(
        "tests/kubernetes/test_pod_templates.py::"
        "test_the_documented_templates_build_the_pods_they_describe"
    )
    documented = yaml.safe_load(example.text)["spec"]
    manifest, document = _job(
        common=documented["podTemplate"],
        driver=documented["driver"]["podTemplate"],
        executor=documented["executor"]["podTemplate"],
    )
    pods = job_pods(manifest, document)
    driver, cleanup = pods["driver"], pods[objects.CLEANUP]
    executors = objects.executor_pod_template(manifest, objects.UserIds.IMAGE)

    assert pod_spec_problems(manifest) == []
    for pod, own in ((driver, "driver"), (cleanup, "cleanup")):
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
        assert [c["name"] for c in pod["spec"]["containers"]] == [own, "log-shipper"]
        assert pod["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] == "4Gi"
        assert pod["spec"]["priorityClassName"] == "streaming"
        assert pod["spec"]["affinity"]["nodeAffinity"]
        assert pod["metadata"]["labels"]["cost-center"] == "42"
        assert "topologySpreadConstraints" not in pod["spec"]
    kubernetes_validate.validate(executors, KUBERNETES_VERSION, strict=True)
    assert [c["name"] for c in executors["spec"]["containers"]] == [objects.EXECUTOR_CONTAINER]
    assert executors["spec"]["topologySpreadConstraints"][0]["maxSkew"] == 1
    assert executors["spec"]["priorityClassName"] == "streaming"
    assert executors["metadata"]["labels"] == {"cost-center": "42"}


# Building blocks of templates, the operator's own names among them, so that the drawn
# templates clash with what the operator and Spark add as often as a user's might.
_NAMES = st.sampled_from(["logs", "scratch", "agent-token", "checkpoint-work", "cache"])
_PATHS = st.sampled_from(["/logs", "/scratch", "/var/run/spark-checkpoint", "/data", "/logs"])
_CONTAINER_NAMES = st.sampled_from([MAIN, "sidecar", "init", "driver", "cleanup"])
_VOLUMES = st.lists(
    st.fixed_dictionaries({"name": _NAMES}).map(lambda v: {**v, "emptyDir": {}}), max_size=3
)
_MOUNTS = st.lists(st.fixed_dictionaries({"name": _NAMES, "mountPath": _PATHS}), max_size=3)
_CONTEXT = st.sampled_from(
    [
        {},
        {"runAsUser": 1000},
        {"runAsUser": 0},
        {"privileged": True},
        {"readOnlyRootFilesystem": True},
    ]
)
_CONTAINERS = st.lists(
    st.fixed_dictionaries(
        {"name": _CONTAINER_NAMES},
        optional={
            "image": st.just("busybox:1.36"),
            "args": st.just(["x"]),
            "volumeMounts": _MOUNTS,
            "securityContext": _CONTEXT,
            "env": st.just([{"name": "TZ", "value": "UTC"}]),
            "resources": st.just({"limits": {"ephemeral-storage": 1073741824}}),
        },
    ),
    max_size=3,
)
_LABELS = st.dictionaries(
    st.sampled_from(["team", "sparkcheckpoint.io/job", "spark-role", "tier"]),
    st.sampled_from(["a", "b"]),
    max_size=2,
)
_TEMPLATES = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries({}, optional={"labels": _LABELS}),
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "containers": _CONTAINERS,
                "initContainers": _CONTAINERS,
                "volumes": _VOLUMES,
                "tolerations": st.just([{"key": "spot", "operator": "Exists"}]),
                "priorityClassName": st.sampled_from(["a", "b"]),
                "securityContext": _CONTEXT,
            },
        ),
    },
)


def _api_server_refusals(pod: dict[str, Any]) -> list[str]:
    """Of the API server's semantic pod validation (beyond the schema), what templates
    could break: names unique, mounts of the pod's volumes at distinct paths, a
    privileged container that may not escalate, an image for every container."""
    spec = pod["spec"]
    refusals = []
    volumes = [volume["name"] for volume in spec.get("volumes", [])]
    if len(volumes) != len(set(volumes)):
        refusals.append(f"duplicate volumes {volumes}")
    containers = [*spec.get("initContainers", []), *spec["containers"]]
    names = [container["name"] for container in containers]
    if len(names) != len(set(names)):
        refusals.append(f"duplicate containers {names}")
    for container in containers:
        mounts = container.get("volumeMounts", [])
        paths = [mount["mountPath"] for mount in mounts]
        if len(paths) != len(set(paths)):
            refusals.append(f"{container['name']}: duplicate mount paths {paths}")
        refusals += [
            f"{container['name']}: mount of no volume {mount['name']}"
            for mount in mounts
            if mount["name"] not in volumes
        ]
        context = container.get("securityContext", {})
        if context.get("privileged") and context.get("allowPrivilegeEscalation") is False:
            refusals.append(f"{container['name']}: privileged without escalation")
        if pod.get("kind") == "Pod" and "image" not in container:
            refusals.append(f"{container['name']}: no image")
    return refusals


@settings(deadline=None, max_examples=150)
@given(common=_TEMPLATES, driver=_TEMPLATES, executor=_TEMPLATES)
def test_templates_without_problems_build_pods_the_api_server_takes(
    common: dict[str, Any], driver: dict[str, Any], executor: dict[str, Any]
) -> None:
    """Whatever the templates, the checks answer (never raise); where they find nothing,
    every pod built over them is one the API server takes (its schema, and its semantic
    checks that templates could break)."""
    manifest, document = _job(common=common, driver=driver, executor=executor)
    problems = pod_spec_problems(manifest)
    if problems:
        return
    for name, pod in job_pods(manifest, document).items():
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
        assert _api_server_refusals(pod) == [], name
        assert pod["spec"]["containers"][0]["name"] == name
    template = objects.executor_pod_template(manifest, objects.UserIds.IMAGE)
    kubernetes_validate.validate(template, KUBERNETES_VERSION, strict=True)
    # Spark adds the image and its own volumes; the rest must hold already.
    template_refusals = _api_server_refusals({**template, "kind": "template"})
    assert [r for r in template_refusals if "mount of no volume" not in r] == []


def test_a_container_beside_the_pods_own_needs_an_image_from_either_template() -> None:
    """The API server refuses a container without one (the property test's find)."""
    bare = {"spec": {"containers": [{"name": "sidecar"}]}}
    imaged = {"spec": {"containers": [{"name": "sidecar", "image": "busybox:1.36"}]}}

    assert _problems(common={}, driver=bare, executor={}) == [
        "spec.driver.podTemplate.spec.containers[0].image: required for 'sidecar' (only the "
        "pod's own container has the job's)"
    ]
    # Listed in the common template only: said once, for the pods of both roles.
    assert _problems(common=bare, driver={}, executor={}) == [
        "spec.podTemplate.spec.containers[0].image: required for 'sidecar' (only the pod's "
        "own container has the job's)"
    ]
    assert _problems(common=imaged, driver=bare, executor={}) == []
