"""The docs' cluster commands (helm, kubectl, spark-checkpoint-operator) need a cluster to
run, so each is checked against what it refers to, as far as that is possible without one:

- ``helm install RELEASE CHART ...``: the chart renders with the command's ``--set`` values
  (Helm's own parser and renderer, values.schema.json included) for that release name and
  namespace;
- ``kubectl rollout status deploy/NAME``: such a Deployment is rendered by an install above;
- ``kubectl apply -f FILE``: a file of the repository is a valid manifest (the project's
  loader for a SparkCheckpointJob, kubernetes-validate for the rest); any other file is the
  reader's own;
- ``kubectl get|describe|explain``: the resource is the CRD's, a described job is one the doc
  defines, an explained field is in the CRD's schema;
- ``spark-checkpoint-operator``: Kopf's ``run`` accepts the arguments after the handlers'
  module, and every module exists.

A command this test does not know fails it: teach it here, or mark the block illustrative.
"""

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import click
import helm_python
import kubernetes_validate
import pytest
import yaml

from helpers.doc_blocks import ROOT, Block, blocks_of, marked_blocks, shell_commands
from spark_checkpoint_operator.kubernetes.main import HANDLERS, PROGRAM, command
from spark_checkpoint_operator.manifest.crd import load_crd
from spark_checkpoint_operator.manifest.loading import manifest_from_document

KUBERNETES_VERSION = "1.30"
CRD = load_crd()
CRD_NAMES = {
    CRD["spec"]["names"]["plural"],
    CRD["spec"]["names"]["singular"],
    CRD["spec"]["names"]["kind"].lower(),
    *CRD["spec"]["names"].get("shortNames", []),
}


@dataclass
class Cluster:
    """What the commands of one doc have installed and applied so far."""

    deployments: set[tuple[str, str]] = field(default_factory=set)  # (namespace, name)
    jobs: set[tuple[str, str]] = field(default_factory=set)
    namespaces: set[str] = field(default_factory=lambda: {"default"})
    # The namespaces each operator installed or run serves; None: every namespace.
    operators: list[frozenset[str] | None] = field(default_factory=list)

    def serve(self, namespaces: frozenset[str] | None) -> None:
        """An operator that serves ``namespaces``, which must exist (its Roles are made in
        them at install, and Kopf watches only those there)."""
        missing = sorted((namespaces or frozenset()) - self.namespaces)
        assert not missing, (
            f"namespaces {', '.join(missing)} do not exist yet: create them before the "
            "operator that serves them"
        )
        self.operators.append(namespaces)

    def check_served(self, namespace: str, what: str) -> None:
        """Jobs in ``namespace`` reach an operator, once one is installed above."""
        served = [n for n in self.operators if n is None or namespace in n]
        assert served or not self.operators, (
            f"{what} in namespace {namespace}, which no operator above serves"
        )


def _commands(block: Block) -> Iterator[list[str]]:
    for words in shell_commands(block.text):
        command: list[str] = []
        for word in [*words, "&&"]:
            if word == "&&":
                yield command
                command = []
            else:
                command.append(word)


def _options(arguments: list[str], flags: dict[str, str]) -> tuple[list[str], dict[str, list[str]]]:
    """Positional arguments and options; ``flags`` maps each known option spelling to its
    name, a trailing ``=`` marking one that takes a value."""
    positional: list[str] = []
    options: dict[str, list[str]] = {}
    words = iter(arguments)
    for word in words:
        if word.startswith("-"):
            spelling, _, inline = word.partition("=")
            name = flags.get(spelling) or flags.get(spelling + "=")
            assert name, f"unknown option {spelling}"
            if spelling + "=" in flags:
                options.setdefault(name, []).append(inline or next(words))
            else:
                options.setdefault(name, []).append("")
        else:
            positional.append(word)
    return positional, options


def _helm(arguments: list[str], cluster: Cluster) -> None:
    (verb, release, chart), options = _options(
        arguments,
        {
            "-n=": "namespace",
            "--namespace=": "namespace",
            "--create-namespace": "create",
            "--set=": "set",
        },
    )
    assert verb == "install", f"helm {verb} is not known here"
    assert (ROOT / chart / "Chart.yaml").is_file(), f"{chart} is not a chart of the repository"
    namespace = options.get("namespace", ["default"])[-1]
    if "create" in options:
        cluster.namespaces.add(namespace)
    values = (
        helm_python.parse_set_string(",".join(options.get("set", []))) if "set" in options else {}
    )
    with helm_python.Chart.load(str(ROOT / chart)) as loaded:
        rendered = loaded.render(values=values, name=release, namespace=namespace)
    for path, text in rendered.items():
        if path.endswith(".yaml"):
            for document in yaml.safe_load_all(text):
                if document and document["kind"] == "Deployment":
                    metadata = document["metadata"]
                    cluster.deployments.add(
                        (metadata.get("namespace", namespace), metadata["name"])
                    )
                    (container,) = document["spec"]["template"]["spec"]["containers"]
                    _operator(container["args"], cluster)


def _apply(path: str, cluster: Cluster, namespace: str | None) -> None:
    file = ROOT / path
    if file.is_dir():  # as kubectl: the directory's manifests, not its subdirectories'
        found = sorted(f for f in file.iterdir() if f.suffix in (".yaml", ".yml", ".json"))
        assert found, f"{path} holds no manifest"
        for each in found:
            _apply(str(each.relative_to(ROOT)), cluster, namespace)
        return
    if not file.is_file():
        assert "/" not in path, f"{path} looks like a file of the repository, but is not one"
        # The reader's own manifest: a job, in the namespace -n names or the default one.
        cluster.check_served(namespace or "default", f"{path}'s job")
        return
    for document in yaml.safe_load_all(file.read_text()):
        if document is None:
            continue
        # As kubectl: an object's own namespace must be the one -n names.
        own = document.get("metadata", {}).get("namespace")
        assert namespace is None or own in (None, namespace), (
            f'the namespace from the provided object "{own}" does not match the namespace '
            f'"{namespace}"'
        )
        if document["kind"] == "SparkCheckpointJob":
            manifest = manifest_from_document(document, path)
            cluster.check_served(manifest.namespace, f"job {manifest.name}")
            cluster.jobs.add((manifest.namespace, manifest.name))
        else:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
            if document["kind"] == "Namespace":
                cluster.namespaces.add(document["metadata"]["name"])


def _explained(path: str) -> None:
    resource, *fields = path.split(".")
    assert resource in CRD_NAMES, f"{resource} is not the CRD's resource"
    version = next(v for v in CRD["spec"]["versions"] if v["storage"])
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    for name in fields:
        assert name in schema.get("properties", {}), f"the CRD has no field {path}"
        schema = schema["properties"][name]


def _kubectl(arguments: list[str], cluster: Cluster) -> None:
    positional, options = _options(
        arguments, {"-n=": "namespace", "--namespace=": "namespace", "-f=": "file"}
    )
    named = options.get("namespace", [None])[-1]
    namespace = named or "default"
    verb, *rest = positional
    if verb == "apply":
        assert not rest and len(options.get("file", [])) == 1, "kubectl apply -f FILE"
        _apply(options["file"][0], cluster, named)
    elif verb == "get":
        (resource,) = rest
        assert resource in CRD_NAMES, f"{resource} is not the CRD's resource"
        cluster.check_served(namespace, "the jobs listed")
    elif verb == "describe":
        resource, name = rest
        assert resource in CRD_NAMES, f"{resource} is not the CRD's resource"
        assert (namespace, name) in cluster.jobs, f"no job {namespace}/{name} is defined above"
    elif verb == "explain":
        (path,) = rest
        _explained(path)
    elif verb == "rollout":
        action, target = rest
        kind, _, name = target.partition("/")
        assert action == "status" and kind in ("deploy", "deployment"), f"rollout {rest}"
        assert (namespace, name) in cluster.deployments, (
            f"no Deployment {namespace}/{name} is installed above: {sorted(cluster.deployments)}"
        )
    else:
        pytest.fail(f"kubectl {verb} is not known here")


def _operator(arguments: list[str], cluster: Cluster) -> None:
    context = command.make_context(PROGRAM, list(arguments))  # Click consumes its list
    for module in (HANDLERS, *context.params["modules"]):
        assert importlib.util.find_spec(module), f"no module {module}"
    everywhere = context.params["clusterwide"]
    cluster.serve(None if everywhere else frozenset(context.params["namespaces"]))


def _namespaces_applied_before(block: Block) -> set[str]:
    """The namespaces that shell blocks of the doc above ``block`` (tested elsewhere, such
    as the user guide's kubectl steps) create from the repository's files."""
    found = set()
    for earlier in blocks_of(block.doc):
        if earlier.line >= block.line or earlier.language not in ("sh", "bash", "shell"):
            continue
        for program, *arguments in _commands(earlier):
            if program != "kubectl" or arguments[:1] != ["apply"] or "-f" not in arguments:
                continue
            file = ROOT / arguments[arguments.index("-f") + 1]
            if file.is_file():
                found |= {
                    document["metadata"]["name"]
                    for document in yaml.safe_load_all(file.read_text())
                    if document and document.get("kind") == "Namespace"
                }
    return found


def test_cluster_commands_refer_to_what_the_project_ships() -> None:
    blocks = marked_blocks(
        "tests/docs/test_cluster_commands.py::test_cluster_commands_refer_to_what_the_project_ships"
    )
    clusters: dict[str, Cluster] = {}
    for block in blocks:
        cluster = clusters.get(block.doc)
        if cluster is None:  # the doc's own job manifests are what the reader applies
            cluster = clusters[block.doc] = Cluster()
            for defined in blocks_of(block.doc):
                if defined.language == "yaml":
                    for document in yaml.safe_load_all(defined.text):
                        if (
                            isinstance(document, dict)
                            and document.get("kind") == "SparkCheckpointJob"
                        ):
                            metadata = document["metadata"]
                            cluster.jobs.add(
                                (metadata.get("namespace", "default"), metadata["name"])
                            )
        cluster.namespaces |= _namespaces_applied_before(block)
        for program, *arguments in _commands(block):
            try:
                if program == "helm":
                    _helm(arguments, cluster)
                elif program == "kubectl":
                    _kubectl(arguments, cluster)
                elif program == "spark-checkpoint-operator":
                    _operator(arguments, cluster)
                else:
                    pytest.fail(f"{program} is not known here")
            except (
                AssertionError,
                ValueError,
                helm_python.HelmError,
                click.ClickException,
                kubernetes_validate.ValidationError,
            ) as error:
                line = " ".join([program, *arguments])
                pytest.fail(f"{block}: `{line}`: {error}")
