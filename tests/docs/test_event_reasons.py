"""Every event reason the operator posts is in docs/operator.md's list of events, read from
the operator's code: every call that makes an event or a notice (`Notice`, `_notify`,
`_post_event`, `kopf.event`, ...), its reason a string, a variable given strings, a
function returning them, or a choice of those; notices of `Level.DETAIL` are only logged.
A reason the reading cannot resolve fails the test (teach it here), so no event slips by."""

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from helpers.doc_blocks import ROOT
from spark_checkpoint_operator.coordinator import TerminalOutcome
from spark_checkpoint_operator.kubernetes.controller import DISPOSALS

CODE = ROOT / "operator" / "spark_checkpoint_operator"
# Where a call's reason is: its position, else its keyword `reason`.
NOTICES = {"Notice": 0, "_notify": 0}
# Events on snapshot objects: posted with what `snapshots.event` returns.
SNAPSHOT_EVENTS = "_post_snapshot_event"
EVENTS = {"_post_event": 1, "post_event": 1, "event": 1, "warn": 1, "info": 1, "exception": 1}


def _documented() -> set[str]:
    text = (ROOT / "docs" / "operator.md").read_text(encoding="utf-8")
    listed = re.search(r"Events: (.*?)Routine checkpoint completions", text, re.DOTALL)
    assert listed is not None, "docs/operator.md has no list of events"
    return set(re.findall(r"`([A-Z][A-Za-z]+)`", listed.group(1)))


def _functions() -> Iterator[tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for path in CODE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield path, node


def _own_nodes(function: ast.AST) -> Iterator[ast.AST]:
    """The function's nodes, not those of the functions defined in it (each is its own)."""
    for child in ast.iter_child_nodes(function):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield child
            yield from _own_nodes(child)


def _returned_strings(name: str) -> list[str]:
    return [
        value.value
        for _path, function in _functions()
        if function.name == name
        for returned in ast.walk(function)
        if isinstance(returned, ast.Return) and returned.value is not None
        for value in ast.walk(returned.value)
        if isinstance(value, ast.Constant) and isinstance(value.value, str)
    ]


def _resolve(
    reason: ast.expr, function: ast.FunctionDef | ast.AsyncFunctionDef
) -> list[str] | None:
    """The reasons ``reason`` can be; [] when it forwards a reason given elsewhere (a
    parameter, a notice's); None when this reading cannot tell."""
    parameters = {a.arg for a in (*function.args.args, *function.args.kwonlyargs)}
    if isinstance(reason, ast.Constant) and isinstance(reason.value, str):
        return [reason.value]
    if isinstance(reason, ast.Name) and reason.id in parameters:
        return []
    if isinstance(reason, ast.Attribute) and reason.attr == "reason":
        return []
    if isinstance(reason, ast.Name):
        assigned = [
            node.value.value
            for node in _own_nodes(function)
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == reason.id for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ]
        return assigned or None
    if isinstance(reason, ast.IfExp):
        branches = [_resolve(reason.body, function), _resolve(reason.orelse, function)]
        return None if None in branches else [r for b in branches for r in b or []]
    if isinstance(reason, ast.Call) and isinstance(reason.func, ast.Name):
        return _returned_strings(reason.func.id) or None
    if isinstance(reason, ast.JoinedStr) and ast.unparse(reason) == "f'Job{outcome.value}'":
        return [f"Job{outcome.value}" for outcome in TerminalOutcome]
    return None


def _snapshot_event_reasons() -> list[str]:
    """What `snapshots.event` returns: (type, reason, message)."""
    return [
        returned.value.elts[1].value
        for path, function in _functions()
        if path.name == "snapshots.py" and function.name == "event"
        for returned in ast.walk(function)
        if isinstance(returned, ast.Return)
        and isinstance(returned.value, ast.Tuple)
        and isinstance(returned.value.elts[1], ast.Constant)
    ]


def _argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _posted() -> tuple[set[str], list[str]]:
    """The reasons posted, and the calls whose reason this reading cannot tell."""
    posted: set[str] = set()
    unread: list[str] = []
    for path, function in _functions():
        for call in _own_nodes(function):
            if not isinstance(call, ast.Call):
                continue
            func = call.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == SNAPSHOT_EVENTS:
                posted.update(_snapshot_event_reasons())
                continue
            if name in NOTICES:
                level = _argument(call, 1, "level")
                if isinstance(level, ast.Attribute) and level.attr == "DETAIL":
                    continue
                reason = _argument(call, NOTICES[name], "reason")
            elif name in EVENTS and (
                not isinstance(func, ast.Attribute)
                or func.attr.startswith("_")
                or ast.unparse(func.value) == "kopf"
            ):
                reason = _argument(call, EVENTS[name], "reason")
            else:
                continue
            resolved = None if reason is None else _resolve(reason, function)
            if resolved is None:
                unread.append(f"{path.relative_to(ROOT)}:{call.lineno}: {ast.unparse(call)}")
            else:
                posted.update(resolved)
    return posted, unread


def test_the_list_of_events_is_what_the_operator_posts() -> None:
    found, unread = _posted()
    assert unread == [], "reasons this test cannot read: teach it"
    # Details of the CLI's, news when a snapshot object's deletion asked (`_on_notice`).
    posted = found | set(DISPOSALS)
    # The reading of the code finds the events it knows are there.
    assert {"DriverFailed", "InvalidSpec", "JobFinished", "SavepointCompleted"} <= posted
    documented = _documented()

    assert sorted(posted - documented) == [], "posted, not in docs/operator.md's list"
    assert sorted(documented - posted) == [], "in docs/operator.md's list, never posted"
