"""Every link between the docs resolves: a relative link names a file of the repository,
and its `#anchor` a heading of that file, as GitHub renders it (the heading's text in lower
case, without punctuation, spaces as '-', a repeated one numbered). Links out of the
repository (http, mailto) are not followed: no network here."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from helpers.doc_blocks import ROOT, doc_paths

_MARKDOWN = MarkdownIt("commonmark").enable("table")


def _inline_text(token: Token) -> str:
    return "".join(
        child.content for child in token.children or () if child.type in {"text", "code_inline"}
    )


def anchors(source: str) -> set[str]:
    """The anchors GitHub gives the headings of Markdown `source`."""
    tokens = _MARKDOWN.parse(source)
    seen: Counter[str] = Counter()
    found = set()
    for opening, inline in itertools.pairwise(tokens):
        if opening.type != "heading_open":
            continue
        slug = re.sub(r"[^\w\- ]", "", _inline_text(inline).strip().lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return found


def links(source: str) -> list[str]:
    """The targets of the links of Markdown `source`."""
    targets = []
    for token in _MARKDOWN.parse(source):
        for child in token.children or ():
            if child.type == "link_open" and isinstance(href := child.attrs.get("href"), str):
                targets.append(href)
    return targets


def broken_links(doc: Path) -> list[str]:
    broken = []
    for target in links(doc.read_text(encoding="utf-8")):
        parts = urlsplit(target)
        if parts.scheme or parts.netloc:
            continue
        linked = (doc.parent / unquote(parts.path)).resolve() if parts.path else doc
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif (
            parts.fragment
            and linked.suffix == ".md"
            and unquote(parts.fragment) not in anchors(linked.read_text(encoding="utf-8"))
        ):
            broken.append(f"{target}: no such heading")
    return broken


@pytest.mark.parametrize("doc", [*doc_paths(), "STYLE.md"])
def test_every_link_of_a_doc_resolves(doc: str) -> None:
    assert broken_links(ROOT / doc) == []


def test_the_check_finds_a_wrong_anchor_and_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text(
        "# Top\n\n## User ids: the image's or the platform's\n\n## Top\n"
    )
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[a](other.md#user-ids-the-images-or-the-platforms) [b](other.md#top-1) [c](#here)\n\n"
        "[d](other.md#user-ids) [e](gone.md) [f](https://example.com/x#y)\n\n# Here\n"
    )
    assert broken_links(doc) == ["other.md#user-ids: no such heading", "gone.md: no such file"]
