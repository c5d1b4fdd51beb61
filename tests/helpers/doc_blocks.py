"""The fenced code blocks of the project's Markdown docs, and the markers that say how each
one is tested (tests/docs/test_docs_run.py explains the markers and enforces them).

A test that covers blocks itself (marker ``tested-by``) reads them with ``marked_blocks``,
so what it runs is the doc's text and the two cannot drift apart.
"""

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]

# Every page a reader follows: README, docs/, and the benchmarks', charts' and examples' pages.
DOC_PATTERNS = (
    "README.md",
    "docs/**/*.md",
    "benchmarks/**/*.md",
    "charts/**/*.md",
    "examples/**/*.md",
)

_MARKER = re.compile(r"<!--\s*(illustrative|tested-by)\s*:(.*?)-->")


@dataclass(frozen=True)
class Marker:
    kind: str  # "illustrative" or "tested-by"
    value: str  # the reason, or the test's node id


@dataclass(frozen=True)
class Block:
    doc: str  # path relative to the repository root
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    marker: Marker | None

    def __str__(self) -> str:
        return f"{self.doc}:{self.line} ({self.language or 'no language'})"


def doc_paths() -> list[str]:
    found = {p for pattern in DOC_PATTERNS for p in ROOT.glob(pattern) if p.is_file()}
    return sorted(p.relative_to(ROOT).as_posix() for p in found)


@cache
def blocks_of(doc: str) -> tuple[Block, ...]:
    return parse_blocks(doc, (ROOT / doc).read_text(encoding="utf-8"))


def parse_blocks(doc: str, source: str) -> tuple[Block, ...]:
    """The fenced code blocks of Markdown ``source`` (named ``doc``), as CommonMark reads
    them (so indented fences in lists count, and fences inside other blocks do not)."""
    lines = source.splitlines()
    blocks = []
    for token in MarkdownIt("commonmark").parse(source):
        if token.type != "fence" or token.map is None:
            continue
        first = token.map[0]
        above = lines[first - 1].strip() if first > 0 else ""
        marker = _MARKER.fullmatch(above)
        blocks.append(
            Block(
                doc=doc,
                line=first + 1,
                language=token.info.split()[0] if token.info.strip() else "",
                text=token.content,
                marker=Marker(marker[1], marker[2].strip()) if marker else None,
            )
        )
    return tuple(blocks)


def all_blocks() -> list[Block]:
    return [block for doc in doc_paths() for block in blocks_of(doc)]


def marked_blocks(test_id: str) -> list[Block]:
    """The blocks whose marker says ``tested-by: <test_id>``; at least one, or the test's
    claim to cover a doc is stale."""
    found = [b for b in all_blocks() if b.marker == Marker("tested-by", test_id)]
    assert found, f"no doc block is marked <!-- tested-by: {test_id} -->"
    return found


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a shell block as argument lists: comments dropped, backslash
    continuations joined, one command per line."""
    joined = re.sub(r"\\\n", " ", text)
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


def venv_environment() -> dict[str, str]:
    """The environment a reader of the docs has: the project's venv first on ``PATH``, so
    ``spark-checkpoint`` is the installed command line."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}


def shell_script(block: Block) -> str:
    """What a shell block runs: its text, or in a ``console`` block its ``$ `` lines."""
    if block.language != "console":
        return block.text
    return "\n".join(line[2:] for line in block.text.splitlines() if line.startswith("$ "))


def run_shell(block: Block, cwd: Path, *, timeout: float = 120) -> str:
    """Run a shell block with ``bash -euo pipefail`` in ``cwd``; its stdout if every command
    succeeds, else an AssertionError naming the block with its output."""
    script = shell_script(block)
    assert shell_commands(script), f"{block}: no command to run"
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=venv_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, (
        f"{block} exits {result.returncode}:\n{block.text}\n"
        f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return result.stdout
