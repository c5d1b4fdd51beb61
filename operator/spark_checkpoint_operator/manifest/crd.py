"""The CRDs the package ships (SparkCheckpointJob, SparkCheckpointSnapshot), and how to walk
their schemas.

The package ships the CRDs as package data: in the checkout symlinks to the ``crds/`` files,
which the wheel build copies as files.
"""

import copy
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

JOB_CRD = "sparkcheckpointjobs.sparkcheckpoint.io"
SNAPSHOT_CRD = "sparkcheckpointsnapshots.sparkcheckpoint.io"


def crd_path(name: str) -> Path:
    """Package data of spark_checkpoint_operator, one level up from this package."""
    return Path(__file__).parent.parent / f"{name}.yaml"


CRD_PATH = crd_path(JOB_CRD)

Schema = Mapping[str, Any]


def load_crd(name: str = JOB_CRD) -> dict[str, Any]:
    """A CustomResourceDefinition, parsed from ``crds/`` (a fresh copy each call)."""
    return copy.deepcopy(cached_crd(name))


def crd_schema() -> dict[str, Any]:
    """The ``openAPIV3Schema`` of the CRD's storage version (a fresh copy each call)."""
    return copy.deepcopy(storage_version(cached_crd())["schema"]["openAPIV3Schema"])


@functools.cache
def cached_crd(name: str = JOB_CRD) -> dict[str, Any]:
    """A CRD, parsed once; callers must not change it."""
    crd: dict[str, Any] = yaml.safe_load(crd_path(name).read_text(encoding="utf-8"))
    return crd


def storage_version(crd: Mapping[str, Any]) -> Mapping[str, Any]:
    version: Mapping[str, Any] = next(v for v in crd["spec"]["versions"] if v["storage"])
    return version


def resource_api_version(crd: Mapping[str, Any]) -> str:
    """``sparkcheckpoint.io/v1alpha1``: the ``apiVersion`` of a stored job."""
    return f"{crd['spec']['group']}/{storage_version(crd)['name']}"


def resource_kind(crd: Mapping[str, Any]) -> str:
    """``SparkCheckpointJob``."""
    name: str = crd["spec"]["names"]["kind"]
    return name


def child_schema(schema: Schema, key: str) -> Schema | None:
    """The schema of an object's field ``key``: a property, else additionalProperties."""
    if key in schema.get("properties", {}):
        child: Schema = schema["properties"][key]
        return child
    additional = schema.get("additionalProperties")
    return additional if isinstance(additional, Mapping) else None


def child_schemas(schema: Schema) -> Iterator[Schema]:
    yield from schema.get("properties", {}).values()
    for key in ("additionalProperties", "items"):
        if isinstance(schema.get(key), Mapping):
            yield schema[key]
