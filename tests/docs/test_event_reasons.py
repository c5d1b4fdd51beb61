"""Every event reason the operator posts is in docs/operator.md's list of events, read from
the operator's code: the notices worth an event (`Level.NOTE`, `Level.WARNING`; `DETAIL` is
only logged) and the controller's own events. A new event that the list misses fails here."""

import ast
import re
from collections.abc import Iterator

from helpers.doc_blocks import ROOT

CODE = ROOT / "operator" / "spark_checkpoint_operator"
# A checkpoint's completion is only logged (`Level.DETAIL`), a savepoint's posted: one call.
ROUTINE = {"CheckpointCompleted"}


def _documented() -> set[str]:
    text = (ROOT / "docs" / "operator.md").read_text(encoding="utf-8")
    listed = re.search(r"Events: (.*?)Routine checkpoint completions", text, re.DOTALL)
    assert listed is not None, "docs/operator.md has no list of events"
    return set(re.findall(r"`([A-Z][A-Za-z]+)`", listed.group(1)))


def _strings_assigned(function: ast.AST, name: str) -> Iterator[str]:
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            yield node.value.value


def _returned_strings(name: str) -> Iterator[str]:
    """The strings the function ``name`` of the operator's code may return."""
    for path in CODE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name == name:
                for returned in ast.walk(node):
                    if isinstance(returned, ast.Return) and returned.value is not None:
                        for value in ast.walk(returned.value):
                            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                                yield value.value


def _reasons(call: ast.Call, function: ast.AST) -> Iterator[str]:
    """The reasons a call can post: a string, every string its variable is given, or every
    string the function that makes it returns."""
    reason = call.args[0]
    if isinstance(reason, ast.Constant) and isinstance(reason.value, str):
        yield reason.value
    elif isinstance(reason, ast.Name):
        yield from _strings_assigned(function, reason.id)
    elif isinstance(reason, ast.Call) and isinstance(reason.func, ast.Name):
        yield from _returned_strings(reason.func.id)
    elif isinstance(reason, ast.JoinedStr):  # f"Job{outcome.value}": the terminal phases
        yield from (f"Job{phase}" for phase in ("Finished", "Suspended", "Failed", "Cancelled"))


def _posted() -> set[str]:
    posted: set[str] = set()
    for path in CODE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in ast.walk(function):
                if not isinstance(call, ast.Call) or not call.args:
                    continue
                called = call.func.attr if isinstance(call.func, ast.Attribute) else None
                if called in ("_notify", "_report") or (
                    isinstance(call.func, ast.Name) and call.func.id == "Notice"
                ):
                    level = call.args[1] if len(call.args) > 1 else None
                    if isinstance(level, ast.Attribute) and level.attr == "DETAIL":
                        continue
                    posted.update(_reasons(call, function))
                elif called == "_post_event" and len(call.args) > 1:
                    posted.update(_reasons(ast.Call(call.func, call.args[1:], []), function))
    return {reason for reason in posted if re.fullmatch(r"[A-Z][A-Za-z]+", reason)}


def test_the_list_of_events_is_what_the_operator_posts() -> None:
    posted = _posted() - ROUTINE
    # The reading of the code finds the events it knows are there.
    assert {"DriverFailed", "InvalidSpec", "JobFinished", "SavepointCompleted"} <= posted
    documented = _documented()

    assert sorted(posted - documented) == [], "posted, not in docs/operator.md's list"
    assert sorted(documented - posted) == [], "in docs/operator.md's list, never posted"
