"""The CRD itself: a structural schema that teaches the API, and CEL that Kubernetes accepts."""

from collections.abc import Iterator, Mapping
from typing import Any

import cel
import pytest
from jsonschema import Draft202012Validator

from spark_checkpoint_operator.coordinator import JobPhase
from spark_checkpoint_operator.manifest import validation
from spark_checkpoint_operator.manifest.crd import crd_schema, load_crd

Node = tuple[str, Mapping[str, Any]]

# CEL's standard functions and operators, as Program.functions() names them after macro
# expansion. Rules are kept to these: both Kubernetes and the local evaluator have them.
STANDARD_CEL = {
    "!_",
    "-_",
    "@in",
    "@not_strictly_false",
    "_!=_",
    "_%_",
    "_&&_",
    "_*_",
    "_+_",
    "_-_",
    "_/_",
    "_<=_",
    "_<_",
    "_==_",
    "_>=_",
    "_>_",
    "_?_:_",
    "_[_]",
    "_||_",
    "contains",
    "double",
    "duration",
    "endsWith",
    "int",
    "matches",
    "size",
    "startsWith",
    "string",
    "timestamp",
}


def _nodes(schema: Mapping[str, Any], pointer: str = "#") -> Iterator[Node]:
    """Every schema node: the root, each property, additionalProperties and items."""
    yield pointer, schema
    for name, child in schema.get("properties", {}).items():
        yield from _nodes(child, f"{pointer}/properties/{name}")
    for key in ("additionalProperties", "items"):
        if isinstance(schema.get(key), Mapping):
            yield from _nodes(schema[key], f"{pointer}/{key}")


def _rules() -> Iterator[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    for pointer, node in _nodes(crd_schema()):
        for rule in node.get("x-kubernetes-validations", ()):
            yield pointer, node, rule


RULES = list(_rules())


def test_names_scope_and_version() -> None:
    crd = load_crd()

    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == "sparkcheckpointjobs.sparkcheckpoint.io"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == ("sparkcheckpoint.io", "Namespaced")
    assert spec["names"] == {
        "kind": "SparkCheckpointJob",
        "listKind": "SparkCheckpointJobList",
        "plural": "sparkcheckpointjobs",
        "singular": "sparkcheckpointjob",
        "shortNames": ["scj"],
        "categories": ["spark"],
    }
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    [version] = load_crd()["spec"]["versions"]

    columns = [(c["name"], c["type"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]

    assert columns == [
        ("Phase", "string", ".status.phase"),
        ("Last Checkpoint", "integer", ".status.lastCheckpoint.id"),
        ("Checkpoint Age", "date", ".status.lastCheckpoint.completionTime"),
        ("Last Savepoint", "integer", ".status.lastSavepoint.id"),
        ("Restores", "integer", ".status.counts.restored"),
        ("Rolled Back", "integer", ".status.rolledBack.generation"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]


@pytest.mark.parametrize(("pointer", "node"), list(_nodes(crd_schema())))
def test_every_node_is_typed_and_described(pointer: str, node: Mapping[str, Any]) -> None:
    # Structural: every node has a type; kubectl explain shows each description (but
    # metadata's, which a structural schema may not have).
    assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}
    if pointer != "#/properties/metadata":
        assert node.get("description", "").strip(), f"{pointer} has no description"


def test_the_schema_is_structural() -> None:
    for pointer, node in _nodes(crd_schema()):
        assert not {"allOf", "anyOf", "oneOf", "not"} & node.keys(), pointer
        assert not {"properties", "additionalProperties"} <= node.keys(), pointer
        if node["type"] == "array":
            assert "items" in node, pointer
        for key in node.get("x-kubernetes-list-map-keys", ()):
            item = node["items"]
            assert key in item.get("required", ()) or "default" in item["properties"][key]
    # The API server validates metadata itself; a CRD may restrict only name and
    # generateName, and give metadata nothing else (apiextensions-apiserver's
    # validateStructuralMetadataInvariants).
    metadata = crd_schema()["properties"]["metadata"]
    assert metadata.keys() == {"type", "properties"}
    assert metadata["type"] == "object"
    assert metadata["properties"].keys() <= {"name", "generateName"}


def test_every_default_is_valid_for_its_field() -> None:
    for pointer, node in _nodes(crd_schema()):
        if "default" in node:
            validator = Draft202012Validator(validation._to_json_schema(node, pointer))
            assert list(validator.iter_errors(node["default"])) == [], pointer


def test_no_field_inside_a_list_item_has_a_default() -> None:
    # Argo CD's diff (client-side, its default) takes a default the API server filled in
    # inside a list item for a change of the item (argo-cd#11074): the job would show
    # OutOfSync for ever, and a self-healing Application re-apply it again and again.
    for pointer, node in _nodes(crd_schema()):
        if "/items/" in pointer:
            assert "default" not in node, pointer


def test_spec_objects_with_defaulted_fields_default_to_empty() -> None:
    # The API server only defaults inside objects that exist, so an object whose fields
    # have defaults must itself default to {} for the fields to be filled in.
    spec = crd_schema()["properties"]["spec"]["properties"]
    for name, node in spec.items():
        fields = node.get("properties", {}).values()
        if any("default" in field for field in fields):
            assert node.get("default") == {}, name


def test_every_pattern_has_a_hint() -> None:
    patterns = {node["pattern"] for _, node in _nodes(crd_schema()) if "pattern" in node}

    assert patterns <= validation.PATTERN_HINTS.keys()


def test_status_phases_are_the_coordinator_job_phases() -> None:
    status = crd_schema()["properties"]["status"]

    assert status["properties"]["phase"]["enum"] == [phase.value for phase in JobPhase]


@pytest.mark.parametrize(
    ("pointer", "node", "rule"), RULES, ids=[rule["rule"] for _, _, rule in RULES]
)
def test_every_cel_rule_compiles_to_standard_cel(
    pointer: str, node: Mapping[str, Any], rule: Mapping[str, Any]
) -> None:
    program = cel.compile(rule["rule"])

    assert "self" in program.variables()
    assert set(program.functions()) <= STANDARD_CEL
    # Kubernetes has no null in CEL: comparing with null does not compile there.
    assert "null" not in rule["rule"]
    assert rule.get("message", "").strip(), "a rule explains itself"
    assert "\n" not in rule["message"]
    if "fieldPath" in rule:
        *parents, field = rule["fieldPath"].removeprefix(".").split(".")
        target = node
        for name in parents:
            target = target["properties"][name]
        assert field in target["properties"], f"{pointer}: fieldPath {rule['fieldPath']}"


def test_the_crd_is_a_valid_kubernetes_object() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")

    kubernetes_validate.validate(load_crd(), "1.30", strict=True)


def test_load_crd_and_crd_schema_return_copies() -> None:
    crd_schema()["properties"].clear()
    load_crd()["spec"].clear()

    assert "spec" in crd_schema()["properties"]
    assert load_crd()["spec"]["group"] == "sparkcheckpoint.io"
