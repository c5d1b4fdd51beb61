"""What is wrong with a manifest: one bounded line per problem, naming the field."""

import json
import re
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass, field

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist = 2, 4, 4

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


@dataclass(frozen=True, slots=True, order=True)
class Problem:
    """One thing wrong with a manifest: the field it is about (``""`` for the whole
    document) and what is wrong. ``location`` is the value that was judged, as keys and
    indexes from the document's root (a rule's object, a list of too many items, the
    parent of a missing field); empty where no value was (the document as a whole, the
    YAML). ``keyword`` is the kind of rule broken (``type``, ``pattern``, a CEL rule's
    ``x-kubernetes-validations``, ...): what ratcheting may let through depends on it."""

    path: str
    message: str
    location: tuple[str | int, ...] = field(default=(), compare=False)
    keyword: str = field(default="", compare=False)  # the rule broken: a schema keyword

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ManifestError(ValueError):
    """A manifest that cannot be used; ``problems`` lists everything found, not just the
    first. Each line of the message names the file and the field."""

    def __init__(self, source: str, problems: Iterable[Problem]) -> None:
        self.source = source
        self.problems = tuple(problems)
        super().__init__("\n".join(f"{source}: {problem}" for problem in self.problems))


def shown(value: object) -> str:
    """A value as a message quotes it: its repr, cut short."""
    return clip(_SHORT.repr(value), 100)


def clip(message: str, limit: int = 300) -> str:
    """One bounded line: a message may quote a value of any size."""
    line = message.replace("\r", "\\r").replace("\n", "\\n")
    return line if len(line) <= limit else f"{line[: limit - 1]}…"


def render_path(path: Iterable[str | int]) -> str:
    """``spec.application.env[2].name``; keys that are not identifiers are bracketed."""
    rendered = ""
    for part in path:
        if isinstance(part, str) and _IDENTIFIER.fullmatch(part) and len(part) <= 80:
            rendered += f".{part}"
        elif isinstance(part, str):
            rendered += f"[{clip(json.dumps(part), 80)}]"
        else:  # a list index, or a YAML key that is not a string
            rendered += f"[{shown(part)}]"
    return rendered.removeprefix(".")
