"""Every `spark-checkpoint ...` a reader may copy that no block runs: the docs' inline code
spans, the examples each command's --help lists and the commands our sources quote in
messages and comments. Each is read by the command line's own parser: a command, option or
value it does not take fails here. (Spans that name a command without its manifest, such as
`spark-checkpoint run`, parse: the manifest is checked after parsing.)"""

import contextlib
import io
import re
import shlex
from collections.abc import Iterator

import pytest
from markdown_it import MarkdownIt

from helpers.doc_blocks import ROOT, doc_paths
from spark_checkpoint_operator.cli import command_line

PROGRAM = "spark-checkpoint"
# A quoted command in source text: `spark-checkpoint ...` within one line.
_QUOTED = re.compile(rf"`({PROGRAM}(?: [^`\n]*)?)`")
SOURCE_DIRECTORIES = ("operator", "spark_app", "examples", "benchmarks")
# What an f-string's placeholder in a quoted command stands for.
PLACEHOLDERS = {"{job}": "-f job.yaml"}


def _doc_spans() -> Iterator[tuple[str, str]]:
    for doc in doc_paths():
        source = (ROOT / doc).read_text(encoding="utf-8")
        for token in MarkdownIt("commonmark").parse(source):
            for child in token.children or ():
                if child.type == "code_inline" and _names_the_program(child.content):
                    paragraph = token.map[0] + 1 if token.map else 0
                    yield f"{doc}:{paragraph}", child.content


def _source_spans() -> Iterator[tuple[str, str]]:
    for directory in SOURCE_DIRECTORIES:
        for path in sorted((ROOT / directory).rglob("*.py")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for quoted in _QUOTED.finditer(line):
                    command = quoted[1]
                    for placeholder, value in PLACEHOLDERS.items():
                        command = command.replace(placeholder, value)
                    yield f"{path.relative_to(ROOT)}:{number}", command


def _help_examples() -> Iterator[tuple[str, str]]:
    parser, commands = command_line()
    for name, command in [("", parser), *commands.items()]:
        for line in (command.epilog or "").splitlines():
            if _names_the_program(line.strip()):
                yield f"spark-checkpoint {name} --help".replace("  ", " "), line.strip()


def _names_the_program(text: str) -> bool:
    return text == PROGRAM or text.startswith(f"{PROGRAM} ")


def _words(command: str) -> list[str]:
    """The words after the program name, up to a comment or the first shell operator
    (`| head -1`)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words = []
    for word in lexer:
        if set(word) <= set("();|&<>"):
            break
        words.append(word)
    assert words[0] == PROGRAM, command
    return words[1:]


SPANS = sorted({*_doc_spans(), *_source_spans(), *_help_examples()})


def test_spans_are_found() -> None:
    """The finders find what they are for: the README's own first command among them."""
    readme_first = f"{PROGRAM} run examples/wordcount/job.yaml"
    assert any(w.startswith("README.md:") and c == readme_first for w, c in SPANS)
    assert any(w.endswith("--help") for w, _ in SPANS)
    assert any(".py:" in w for w, _ in SPANS)


def _refusal(command: str) -> str | None:
    """Why the command line would not take ``command``, or None. The program alone names
    it, and a command's option at the end names that option (`spark-checkpoint run
    --from`): both are taken when the rest is."""
    words = _words(command)
    if not words:
        return None
    parser, commands = command_line()
    if len(words) > 1 and words[-1].startswith("-") and words[0] in commands:
        option = words[-1]
        listed = rf"(^|[\s,]){re.escape(option)}(?=[\s,=]|$)"
        if not re.search(listed, commands[words[0]].format_help(), flags=re.MULTILINE):
            return f"{PROGRAM} {words[0]} has no option {option}"
        words = words[:-1]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            _, unrecognized = parser.parse_known_args(words)
    except SystemExit:
        return stderr.getvalue().strip()
    return f"{PROGRAM} does not take {unrecognized}" if unrecognized else None


@pytest.mark.parametrize(("where", "command"), SPANS, ids=[f"{w} {c}" for w, c in SPANS])
def test_a_quoted_command_is_one_the_command_line_takes(where: str, command: str) -> None:
    refusal = _refusal(command)
    assert refusal is None, f"{where}: `{command}`: {refusal}"


def test_a_command_the_command_line_refuses_fails_here() -> None:
    """The check above can fail: a misspelt option, a value of the wrong form, an option
    named at the end that the command has not, and an unknown command are each refused."""
    for command, refusal in {
        f"{PROGRAM} list --wide -f job.yaml": "does not take ['--wide']",
        f"{PROGRAM} run job.yaml --from savepoint:x": "argument --from",
        f"{PROGRAM} run --metrics": "has no option --metrics",
        f"{PROGRAM} restore job.yaml": "invalid choice: 'restore'",
    }.items():
        assert refusal in (_refusal(command) or ""), command


def test_words_end_at_a_comment_or_a_shell_operator() -> None:
    assert _words(f"{PROGRAM} list -f job.yaml | head -1") == ["list", "-f", "job.yaml"]
    assert _words(f"{PROGRAM} run -f job.yaml   # Ctrl-C: savepoint") == ["run", "-f", "job.yaml"]
    assert _words(f"{PROGRAM} status -f 'my job.yaml'&& echo") == ["status", "-f", "my job.yaml"]
