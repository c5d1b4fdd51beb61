"""Hypothesis strategies for manifests a user (or an attacker) might write: a valid
SparkCheckpointJob with a drawn configuration, then one part of it replaced, removed or
added with a hostile value, or its YAML text spliced with hostile YAML."""

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

FIXTURES = Path(__file__).parent.parent / "manifest" / "fixtures"
BASES = [
    yaml.safe_load((FIXTURES / name).read_text(encoding="utf-8"))
    for name in ("minimal-job.yaml", "full-job.yaml")
]

Path_ = tuple[str | int, ...]

# Values that crossed the line before: patterns that accepted a trailing newline, durations
# beyond Go's range, int64 overflows, integral floats, names too long for a label value.
SUSPECT_STRINGS = [
    "5s\n",
    "probe\n",
    "probe",
    "/data/checkpoints\n",
    "2562047h",
    "2562048h",
    "99999999999999999999h",
    "0s",
    "1h30m",
    "0.5ns",
    "a" * 63,
    "a" * 64,
    "a" * 254,
    "x" * 5000,
    "s3a://bucket/path",
    "file:///data",
    "../../etc",
    "1g",
    "2 GiB",
    "pipelines.orders",
    "Running",
    "Suspended",
    "NaN",
    "\x00",
    "\u2028",
    "\ud800",  # a YAML "\ud800" escape: a lone surrogate, no text
    "/data/\udcff",  # a command-line path's byte that is not UTF-8, as Python carries it
    "ünïcödé",
]
SUSPECT_NUMBERS = [
    0,
    -1,
    1,
    2.0,
    2.5,
    -(1 << 63),
    (1 << 63) - 1,
    1 << 63,
    1 << 200,
    float(1 << 53),
    1e308,
    float("inf"),
    float("nan"),
    True,
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(SUSPECT_STRINGS),
    st.sampled_from(SUSPECT_NUMBERS),
    st.from_regex(r"[0-9]{1,22}(\.[0-9]{1,3})?(ns|us|ms|s|m|h)", fullmatch=True),
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)

# YAML that is hostile as text rather than as a value.
YAML_SNIPPETS = [
    "x: &a [*a]\n",
    "x: *undefined\n",
    "x: !!python/object/apply:os.system ['true']\n",
    "<<: *nothing\n",
    "\t- tab\n",
    "---\nkind: Other\n",
    "? [a, b]\n: c\n",
    "x: " + "[" * 200 + "]" * 200 + "\n",
    "b: &b [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(
        f"b{i}: &b{i} [{', '.join([f'*b{i - 1}' if i > 1 else '*b'] * 10)}]\n" for i in range(1, 6)
    ),
    "x: !!binary aGVsbG8=\n",
    "x: 2026-01-01\n",
    "x: 0x1F\n",
    "x: .inf\n",
    "%YAML 1.1\n---\n",
    "\ufeffx: y\n",
    "x: 'unterminated\n",
]


def _paths(value: Any, path: Path_ = ()) -> Iterator[Path_]:
    yield path
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, (*path, index))


_SECOND = 10**9
_GO_UNITS = [("h", 3600 * _SECOND), ("m", 60 * _SECOND), ("s", _SECOND), ("ms", 10**6)]
_GO_UNITS += [("us", 10**3), ("ns", 1)]
_FLOOR = 10**7  # the CRD's least interval and timeout, 10ms
_LONGEST = 2562047 * 3600 * _SECOND  # the CRD's longest duration


@st.composite
def go_duration(draw: st.DrawFn, nanoseconds: int) -> str:
    """`nanoseconds` spelled as a Go duration the way a user might: in units and decimal
    fractions drawn (1.4s, 1400ms, 1s400ms, 0.0014s), now and then with a term Go
    truncates to nothing (0.5ns)."""
    terms, rest = [], nanoseconds
    for unit, size in _GO_UNITS:
        whole, remainder = divmod(rest, size)
        digits = len(str(size)) - 1  # a decimal fraction is exact in s, ms and us
        if remainder and size == 10**digits and draw(st.integers(0, 3)) == 0:
            fraction = f"{remainder:0{digits}d}".rstrip("0")
            terms.append(f"{whole}.{fraction}{unit}")
            break
        if whole and (size == 1 or draw(st.booleans())):
            terms.append(f"{whole}{unit}")
            rest = remainder
    if not terms:
        terms.append(f"0{draw(st.sampled_from([unit for unit, _ in _GO_UNITS]))}")
    if draw(st.integers(0, 4)) == 0:
        terms.insert(draw(st.integers(0, len(terms))), f"0.{draw(st.integers(1, 9))}ns")
    return "".join(terms)


@st.composite
def configured(draw: st.DrawFn) -> dict[str, Any]:
    """A valid manifest whose coordinator configuration is drawn too."""
    document = copy.deepcopy(draw(st.sampled_from(BASES)))
    checkpointing = document["spec"].setdefault("checkpointing", {})
    interval = draw(st.just(0) | st.integers(min_value=_FLOOR, max_value=_LONGEST))
    min_pause = draw(st.just(interval) | st.integers(0, interval or _LONGEST))
    checkpointing.update(
        interval=draw(go_duration(interval)),
        minPause=draw(go_duration(min_pause)),
        timeout=draw(go_duration(draw(st.integers(min_value=_FLOOR, max_value=_LONGEST)))),
        maxConcurrent=draw(st.integers(min_value=1, max_value=16)),
        tolerableFailures=draw(st.integers(min_value=0, max_value=5)),
        retained=draw(st.integers(min_value=1, max_value=100)),
    )
    return document


@st.composite
def mutated(draw: st.DrawFn) -> tuple[dict[str, Any], Path_]:
    """A configured manifest with one node replaced, removed, or given an extra key; and
    the path of that node."""
    document = draw(configured())
    path = draw(st.sampled_from(list(_paths(document))))
    action = draw(st.sampled_from(["replace", "remove", "add"]))
    if not path:
        return draw(values), path  # the whole document replaced
    *parent_path, last = path
    parent: Any = document
    for part in parent_path:
        parent = parent[part]
    if action == "remove":
        del parent[last]
    elif action == "add" and isinstance(parent[last], dict):
        key = draw(st.text(max_size=12) | st.sampled_from(["bogus", "status", "intervall"]))
        parent[last][key] = draw(values)
        path = (*path, key)
    else:
        parent[last] = draw(values)
    return document, path


@st.composite
def hostile_yaml(draw: st.DrawFn) -> str:
    """The YAML of a mutated manifest, possibly with a hostile snippet spliced in."""
    document, _ = draw(mutated())
    text = yaml.safe_dump(document, allow_unicode=draw(st.booleans()))
    if draw(st.booleans()):
        lines = text.splitlines(keepends=True)
        at = draw(st.integers(min_value=0, max_value=len(lines)))
        lines.insert(at, draw(st.sampled_from(YAML_SNIPPETS) | st.text(max_size=40)))
        text = "".join(lines)
    return text
