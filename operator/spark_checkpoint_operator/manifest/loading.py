"""Manifest files and text to a ``JobManifest``: YAML read strictly (duplicate keys are
errors) and bounded in size, nesting and alias expansion, so hostile YAML costs bounded
time and memory; one SparkCheckpointJob per file (beside what kubectl applies with it);
every problem on one line naming the file."""

import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

from spark_checkpoint_operator.local_files import UnreadableFile, read_small_file
from spark_checkpoint_operator.manifest.crd import cached_crd, resource_kind
from spark_checkpoint_operator.manifest.cron import schedule_problem
from spark_checkpoint_operator.manifest.model import JobManifest, to_manifest
from spark_checkpoint_operator.manifest.problems import (
    ManifestError,
    Problem,
    clip,
    render_path,
    shown,
)
from spark_checkpoint_operator.manifest.validation import (
    MAX_MANIFEST_DEPTH,
    validate_document,
    validate_update,
)

# Bounds on a manifest file. Aliases are expanded when the document is used, so a 1 KB
# file of nested aliases (a "billion laughs") stands for billions of values: the expanded
# size is what is bounded. The API server's own bounds are larger (3 MiB requests), but
# PyYAML reads some 25,000 tokens a second; no job manifest comes near these bounds.
MAX_MANIFEST_BYTES = 512 << 10
MAX_MANIFEST_VALUES = 10_000  # scalars, lists and mappings, with aliases expanded


def load_manifest(path: str | os.PathLike[str]) -> JobManifest:
    """Read, validate and default the SparkCheckpointJob in the YAML file at ``path``."""
    source = os.fspath(path)
    try:
        text = read_small_file(path, MAX_MANIFEST_BYTES).decode("utf-8")
    except UnreadableFile as error:
        raise ManifestError(source, [Problem("", f"cannot read the file: {error}")]) from None
    except OSError as error:
        reason = error.strerror or str(error)
        raise ManifestError(source, [Problem("", f"cannot read the file: {reason}")]) from error
    except UnicodeDecodeError as error:
        raise ManifestError(source, [Problem("", f"not UTF-8 text: {error}")]) from error
    return parse_manifest(text, source)


def parse_manifest(text: str, source: str = "<manifest>") -> JobManifest:
    """Like ``load_manifest`` for YAML text; ``source`` names it in messages."""
    return manifest_from_document(_parse_yaml(text, source), source)


def manifest_from_document(document: object, source: str = "<manifest>") -> JobManifest:
    """Validate and default a parsed document, then convert it to a ``JobManifest``."""
    _require_text(document, source)
    defaulted = validate_document(document, source)
    _require_no_nul(defaulted, source)
    _require_schedule(defaulted, source)
    return to_manifest(defaulted)


def _require_schedule(
    defaulted: Mapping[str, Any],
    source: str,
    tolerated: Sequence[Problem] = (),
    previous: Mapping[str, Any] | None = None,
) -> None:
    """What the schema cannot say: a cron expression the coordinator can follow. Not
    asked again of one ``previous`` held (ratcheted): a schedule that ran out (its years
    past) takes no more savepoints, and the job goes on."""
    schedule = defaulted["spec"]["savepoints"].get("schedule")
    if schedule is None or schedule == _previous_schedule(previous):
        return
    if (problem := schedule_problem(schedule)) is not None:
        raise ManifestError(source, [*tolerated, Problem("spec.savepoints.schedule", problem)])


def _previous_schedule(previous: Mapping[str, Any] | None) -> Any:
    spec = (previous or {}).get("spec")
    savepoints = spec.get("savepoints") if isinstance(spec, Mapping) else None
    return savepoints.get("schedule") if isinstance(savepoints, Mapping) else None


def text_problems(document: object) -> list[Problem]:
    """Strings (and keys) that are not Unicode text, which the API server does not store
    (it takes UTF-8) and the CRD's rules cannot read: a command-line path's bytes that are
    not UTF-8 (Python carries each as a lone surrogate) or a YAML ``"\\ud800"`` escape."""
    return _string_problems(document, _not_text)


def _require_text(document: object, source: str) -> None:
    # Before validation: a rule given such a string fails with CEL's "Conversion Error".
    if problems := text_problems(document):
        raise ManifestError(source, problems)


def _require_no_nul(document: Mapping[str, Any], source: str) -> None:
    """The API server takes a NUL character in a string (JSON has it), but no path,
    argument, environment variable or label can hold one: the job would fail far from its
    cause (a traceback of ``embedded null byte``)."""
    if problems := _string_problems(document, _nul):
        raise ManifestError(source, problems)


def _string_problems(document: object, judge: Callable[[str], str | None]) -> list[Problem]:
    """The problems ``judge`` finds in the strings and keys of ``document``: what it says
    is wrong, after the string as quoted. Walked without recursion (this may run before
    the document's nesting is bounded)."""
    found = []
    stack: list[tuple[object, tuple[str | int, ...]]] = [(document, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str) and (wrong := judge(value)):
            found.append(Problem(render_path(path), f"{_quoted(value)} {wrong}", path))
        elif isinstance(value, Mapping):
            for key, child in value.items():
                if isinstance(key, str) and (wrong := judge(key)):
                    found.append(
                        Problem(render_path(path), f"the key {_quoted(key)} {wrong}", path)
                    )
                stack.append((child, (*path, str(key))))
        elif isinstance(value, list):
            stack.extend((item, (*path, index)) for index, item in enumerate(value))
    return sorted(found)


def _nul(text: str) -> str | None:
    if "\0" in text:
        return "contains a NUL character, which no path, argument or variable can hold"
    return None


def _not_text(text: str) -> str | None:
    surrogate = next((c for c in text if "\ud800" <= c <= "\udfff"), None)
    if surrogate is None:
        return None
    if _as_bytes(text) is not None:
        return f"is not UTF-8 text (the byte \\x{ord(surrogate) - 0xDC00:02x})"
    return f"holds a UTF-16 surrogate (\\u{ord(surrogate):04x}), which is no text"


def _as_bytes(text: str) -> bytes | None:
    """The bytes a command-line argument was made of, if it has any that are not UTF-8."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return None


def _quoted(text: str) -> str:
    if _not_text(text) and (raw := _as_bytes(text)) is not None:
        return clip(repr(raw)[1:], 100)  # as the bytes they are: '/data/\\xff'
    return shown(text)


# Problems of a value's shape or bounds: the manifest is read on the schema's word that
# there are none (a duration's form, an enum's values, a count of at least 1), so a job
# cannot run with one, ratcheted or not.
_UNREADABLE_KEYWORDS = frozenset(
    {
        "type",
        "enum",
        "pattern",
        "required",
        "format",
        "const",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "minItems",
    }
)


def manifest_from_update(
    document: object, previous: Mapping[str, Any] | None, source: str = "<manifest>"
) -> tuple[JobManifest, tuple[Problem, ...]]:
    """``manifest_from_document`` for a document that replaces ``previous`` (if any): a
    problem of a value ``previous`` already held is tolerated (``validate_update``) and
    returned, unless it is one of a value's shape or bounds or the job cannot be run with
    it."""
    _require_text(document, source)
    defaulted, tolerated = validate_update(document, previous, source)
    _require_no_nul(defaulted, source)
    if unreadable := [p for p in tolerated if p.keyword in _UNREADABLE_KEYWORDS]:
        raise ManifestError(source, unreadable)
    _require_schedule(defaulted, source, tolerated, previous)
    try:
        manifest = to_manifest(defaulted)
        manifest.coordinator_config()  # checks what the coordinator needs of the settings
    except (KeyError, TypeError, ValueError) as error:
        raise ManifestError(source, [*tolerated, Problem("", f"cannot be run: {error}")]) from None
    return manifest, tolerated


class _StrictLoader(yaml.SafeLoader):
    """PyYAML keeps the last of duplicate keys; a manifest with two ``interval:`` lines is a
    mistake worth reporting. Composing is recursive, so nesting is bounded as it is read."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.values = 0

    def fetch_flow_collection_start(self, TokenClass: type[yaml.Token]) -> None:
        # The scanner looks ahead over every open bracket (each may start a key), so deep
        # flow nesting is refused here, before it costs quadratic time.
        if self.flow_level >= MAX_MANIFEST_DEPTH:
            raise yaml.scanner.ScannerError(
                None,
                None,
                f"nested more than {MAX_MANIFEST_DEPTH} levels deep",
                self.get_mark(),
            )
        super().fetch_flow_collection_start(TokenClass)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except ValueError as error:  # an unquoted 2024-02-30, an integer of 5,000 digits
            message = str(error).split(":")[0]
            raise yaml.constructor.ConstructorError(
                None, None, f"{message}: {shown(node.value)}", node.start_mark
            ) from None

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        self.depth += 1
        self.values += not isinstance(event, yaml.AliasEvent)
        try:
            if self.depth > MAX_MANIFEST_DEPTH or self.values > MAX_MANIFEST_VALUES:
                too_many = f"more than {MAX_MANIFEST_VALUES} values"
                too_deep = f"nested more than {MAX_MANIFEST_DEPTH} levels deep"
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    too_deep if self.depth > MAX_MANIFEST_DEPTH else too_many,
                    event.start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` keys may be overridden
            continue
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):  # `on:`, `1:`, `~:` (JSON and the API hold string keys)
            written = key_node.value if isinstance(key_node, yaml.ScalarNode) else shown(key)
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f'the key {written} is not a string to YAML; quote it: "{written}"',
                key_node.start_mark,
            )
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key: construct_mapping reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {shown(key)}", key_node.start_mark
            )
    mapping = loader.construct_mapping(node, deep=True)
    # Keys a `<<:` merge brought in, which the loop above does not see.
    if merged := [key for key in mapping if not isinstance(key, str)]:  # ~ and 0 too
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"the key {shown(merged[0])} (merged with <<) is not a string to YAML; quote it",
            node.start_mark,
        )
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

# A pair of UTF-16 surrogate escapes, as JSON writes a character beyond U+FFFF ("\ud83d\ude00"):
# PyYAML keeps the halves, a JSON parser and the API server read one character.
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def _construct_str(loader: _StrictLoader, node: yaml.ScalarNode) -> str:
    text = loader.construct_scalar(node)
    return _SURROGATE_PAIR.sub(
        lambda pair: pair[0].encode("utf-16-le", "surrogatepass").decode("utf-16-le"), text
    )


_StrictLoader.add_constructor("tag:yaml.org,2002:str", _construct_str)


def _parse_yaml(text: str, source: str) -> object:
    if len(text.encode("utf-8", errors="replace")) > MAX_MANIFEST_BYTES:
        problem = Problem("", f"larger than {MAX_MANIFEST_BYTES} bytes; a manifest is far smaller")
        raise ManifestError(source, [problem])
    try:
        documents = _documents(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = Problem("", clip(f"{where}invalid YAML: {error.problem}"))
        raise ManifestError(source, [problem]) from None
    except yaml.YAMLError as error:  # e.g. a control character, which has no mark
        raise ManifestError(source, [Problem("", clip(f"invalid YAML: {error}"))]) from None
    if len(documents) == 1:
        return documents[0]  # of whatever kind: validation names what is wrong with it
    # A file kubectl applies may hold what the job needs beside it (a Secret, a claim).
    kind = resource_kind(cached_crd())
    jobs = [d for d in documents if isinstance(d, dict) and d.get("kind") == kind]
    if len(jobs) == 1:
        return jobs[0]
    if not documents:
        found = "none"
    elif jobs:
        found = f"{len(jobs)}; a manifest names one job"
    else:
        kinds = ", ".join(
            str(d.get("kind", "no kind")) if isinstance(d, dict) else type(d).__name__
            for d in documents
        )
        found = f"none among its {len(documents)} documents ({clip(kinds, 100)})"
    raise ManifestError(source, [Problem("", f"expected one {kind} document, found {found}")])


def _documents(text: str) -> list[object]:
    loader = _StrictLoader(text)
    try:
        documents = []
        while loader.check_node():
            if (node := loader.get_node()) is None:
                break
            _check_expanded_size(node)
            if (document := loader.construct_document(node)) is not None:
                documents.append(document)
        return documents
    finally:
        loader.dispose()


def _check_expanded_size(root: yaml.Node) -> None:
    """Refuse a document whose aliases expand it beyond MAX_MANIFEST_VALUES values or
    MAX_MANIFEST_DEPTH levels, or that contains itself; computed on the composed nodes
    (each counted once), without expanding anything."""
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded values, depth)
    visiting: set[int] = set()
    stack: list[yaml.Node] = [root]
    while stack:
        node = stack[-1]
        if id(node) in sizes:
            stack.pop()
            continue
        children = _child_nodes(node)
        if id(node) not in visiting:
            visiting.add(id(node))
            for child in children:
                if id(child) in visiting:
                    raise yaml.composer.ComposerError(
                        None, None, "an alias refers to a value that contains it", node.start_mark
                    )
                if id(child) not in sizes:
                    stack.append(child)
            continue
        stack.pop()
        visiting.discard(id(node))
        size = 1 + sum(sizes[id(child)][0] for child in children)
        depth = 1 + max((sizes[id(child)][1] for child in children), default=0)
        if size > MAX_MANIFEST_VALUES or depth > MAX_MANIFEST_DEPTH:
            limit = (
                f"more than {MAX_MANIFEST_VALUES} values"
                if size > MAX_MANIFEST_VALUES
                else f"more than {MAX_MANIFEST_DEPTH} levels deep"
            )
            raise yaml.composer.ComposerError(
                None, None, f"{limit} once its aliases are expanded", node.start_mark
            )
        sizes[id(node)] = (size, depth)


def _child_nodes(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []
