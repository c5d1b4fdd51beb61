"""What every ``spark-checkpoint`` subcommand shares, so that they behave alike and as
kubectl and the Flink CLI do: ``-f FILE`` for the manifest, ``-o json|yaml|wide`` for the
output, one-line usage errors, the exit codes (defined here once and rendered into each
command's ``--help``), and a quiet exit when standard output is closed early (``| head``).
"""

import argparse
import contextlib
import json
import math
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn, TextIO

import yaml

from spark_checkpoint.storage import printable
from spark_checkpoint_operator.exit_codes import ExitCode
from spark_checkpoint_operator.manifest.loading import text_problems
from spark_checkpoint_operator.manifest.validation import DEFAULT_NAMESPACE, field_problems

# What a code means when the command has nothing more specific to say.
GENERAL_MEANINGS: Mapping[ExitCode, str] = {
    ExitCode.OK: "done",
    ExitCode.FAILED: "the command ran and what it checked or asked for failed",
    ExitCode.USAGE: "bad usage: an unknown option or value, or a manifest that cannot be read",
    ExitCode.NO_RUNTIME: "no `spark-checkpoint run` of the job is running",
    ExitCode.DECLINED: "the checkpoint coordinator declined the request",
    ExitCode.REFUSED: "refused: the control directory is not private, or the token is wrong",
    ExitCode.CANCELLED: "interrupted (Ctrl-C)",
    ExitCode.CLOSED_PIPE: "standard output was closed before all was written (`| head`)",
}


def epilog(examples: Sequence[str], exit_codes: Mapping[ExitCode, str]) -> str:
    """A command's ``--help`` epilog: its examples and its exit codes. Every command may
    exit 2 (usage), 130 (Ctrl-C) and 141 (closed pipe): those are added unless
    ``exit_codes`` says more."""
    codes = {
        ExitCode.USAGE: GENERAL_MEANINGS[ExitCode.USAGE],
        ExitCode.CANCELLED: GENERAL_MEANINGS[ExitCode.CANCELLED],
        ExitCode.CLOSED_PIPE: GENERAL_MEANINGS[ExitCode.CLOSED_PIPE],
        **exit_codes,
    }
    lines = ["examples:", *(f"  {example}" for example in examples), "", "exit codes:"]
    lines += [f"  {code:<4} {codes[code]}" for code in sorted(codes)]
    return "\n".join(lines) + "\n"


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps a one-line description; keeps a text of several lines (an epilog's examples
    and exit codes) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line naming the command and the
    problem, exit code 2 (argparse's is the whole usage block first). Options are spelled
    out: an abbreviation (``--deta``) is not taken, so that a later option sharing its start
    cannot change what a script's command line means."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str, hint: str = "") -> NoReturn:
        see = f"{hint}; see {self.prog} --help" if hint else f"see {self.prog} --help"
        self.exit(ExitCode.USAGE, f"{self.prog}: {message} ({see})\n")

    def refuse_unrecognized(self, words: list[str], *, manifest_named: bool) -> NoReturn:
        """Words the command does not take; a manifest among them, given as `run` takes it
        (`status job.yaml`), is named with -f here (unless -f named one already)."""
        manifests = [word for word in words if word.endswith((".yaml", ".yml", ".json"))]
        takes_manifest = "-f" in self._option_string_actions and not manifest_named
        hint = f"a manifest is named with -f {shlex.quote(manifests[0])}" if manifests else ""
        self.error(f"unrecognized arguments: {shlex.join(words)}", hint if takes_manifest else "")


def manifest_file(text: str) -> Path:
    """A manifest's path as given: neither empty (read as the current directory) nor
    kubectl's ``-`` for standard input, which a run, reading its manifest again, cannot
    take."""
    if not text:
        raise argparse.ArgumentTypeError("is empty: give the manifest's file")
    if text == "-":
        raise argparse.ArgumentTypeError("standard input is not read: give the manifest's file")
    return Path(text)


def add_manifest_option(parser: argparse._ActionsContainer, help_text: str, **kwargs: Any) -> None:
    """``-f FILE`` (kubectl's ``--filename``; ``--manifest`` as before) names the job."""
    kwargs.setdefault("dest", "manifest")
    parser.add_argument(
        "-f",
        "--filename",
        "--manifest",
        type=manifest_file,
        metavar="FILE",
        help=help_text,
        **kwargs,
    )


def add_job_options(parser: argparse._ActionsContainer) -> None:
    """``--namespace`` and ``--job`` name the job where no manifest does (`job_options`)."""
    parser.add_argument(
        "--namespace",
        "-n",
        metavar="NS",
        help=f"the job's namespace (default: {DEFAULT_NAMESPACE})",
    )
    parser.add_argument("--job", metavar="NAME", help="the job's name")


class OutputFormat(StrEnum):
    """``-o``: a document for scripts (JSON, YAML) or the table with more columns."""

    JSON = "json"
    YAML = "yaml"
    WIDE = "wide"


def add_output_option(parser: argparse.ArgumentParser, *formats: OutputFormat) -> None:
    """``-o FORMAT`` (default: the table for people), and ``--json`` for ``-o json``."""
    names = "|".join(formats)

    def output_format(text: str) -> OutputFormat:
        if text not in formats:
            raise argparse.ArgumentTypeError(f"{text!r} is not an output format: use {names}")
        return OutputFormat(text)

    output = parser.add_mutually_exclusive_group()
    output.add_argument(
        "-o",
        "--output",
        type=output_format,
        metavar=names,
        help="a JSON or YAML document (times RFC 3339 UTC, sizes in bytes)"
        + (", or the table with more columns" if OutputFormat.WIDE in formats else "")
        + " (default: a table)",
    )
    output.add_argument(
        "--json", dest="output", action="store_const", const=OutputFormat.JSON, help="-o json"
    )


def seconds(*, zero: bool = False, at_most: float = math.inf) -> Callable[[str], float]:
    """argparse's type for a finite number of seconds above 0 (from 0 with ``zero``), up to
    ``at_most``."""
    lowest = "from 0" if zero else "above 0"
    highest = f" up to {at_most:g}" if at_most < math.inf else ""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        above_lowest = value >= 0 if zero else value > 0
        if not (above_lowest and value <= at_most and math.isfinite(value)):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number of seconds {lowest}{highest}"
            )
        return value

    return parse


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """argparse's type for a whole number of ``minimum`` or more (and ``maximum`` or
    less)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of {minimum} or more")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{text!r} is more than {maximum}")
        return value

    return parse


def directory(text: str) -> Path:
    """argparse's type for a directory: an empty one is refused (it read as the current
    directory, where another run's state may be), and so is a path that exists and is no
    directory (a file: every command failed on it later, as an I/O error)."""
    if not text:
        raise argparse.ArgumentTypeError("'' names no directory ('.' names this one)")
    path = Path(text)
    try:
        if path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    except OSError as error:  # a directory above it that may not be searched
        raise argparse.ArgumentTypeError(f"{text!r}: {error.strerror or error}") from None
    return path


def port_number(text: str) -> int:
    """argparse's type for a TCP port to listen on."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number from 1 to 65535")
    return value


def print_document(document: Mapping[str, Any], output: OutputFormat, out: TextIO) -> None:
    """A command's document as JSON or YAML: the same fields, the same types."""
    if output is OutputFormat.YAML:
        text = yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True)
    else:
        text = json.dumps(document, indent=2) + "\n"
    # A line at a time: one write of a large text that the reader stops reading half-way
    # returns as if complete (the write(2) that reached the pipe's end counts as written),
    # so the command would end with 0 and the rest of the document lost.
    out.writelines(text.splitlines(keepends=True))


def error_lines(prog: str, error: object) -> str:
    """``error`` as lines of ``prog`` on standard error, each naming the command (a
    manifest's problems are a line each)."""
    return "\n".join(f"{prog}: {line}" for line in str(error).splitlines() or [""])


def exit_quietly_on_closed_pipe(command: Callable[[], int]) -> int:
    """Run ``command``; if the reader of standard output goes away (``| head -1``), exit
    141 without a traceback, as the recipe of Python's ``signal`` documentation does."""
    try:
        code = command()
        sys.stdout.flush()  # what is still buffered may meet the closed pipe too
    except BrokenPipeError:
        discard_output(sys.stdout)
        return ExitCode.CLOSED_PIPE
    return code


def discard_output(stream: TextIO) -> None:
    """Point ``stream``'s descriptor at /dev/null once its reader is gone: Python flushes
    it again at exit, which must not meet the closed pipe."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def format_table(rows: Iterable[Sequence[str]], right_aligned: set[int]) -> list[str]:
    """Rows as columns two spaces apart, as ``kubectl get`` prints them; a cell's
    characters a terminal would act on are escaped (a cell may quote storage or a status
    file: a query id could clear the screen or forge a row)."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[column]) if column in right_aligned else cell.ljust(widths[column])
            for column, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


class OptionError(ValueError):
    """An option's value breaks the rules of the manifest field it stands for; the
    message names the option."""


# A scheme and a colon: a value that is no local path even if malformed (``s3:/bucket``),
# which the field's rules then refuse.
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def storage_option(value: str) -> str:
    """``--storage``, judged by the rules of ``spec.checkpointing.storage``. A path is
    read as any command line path is (``~``, then from the current directory); the
    manifest's field, read by processes in other directories, takes only absolute paths
    and URIs."""
    if not value:
        raise OptionError("--storage: is empty: give a path or a URI")
    if not _SCHEME.match(value):
        value = os.path.abspath(os.path.expanduser(value))
    return _field_option("--storage", ("spec", "checkpointing", "storage"), value)


def job_options(namespace: str | None, job: str) -> tuple[str, str]:
    """``--namespace`` (by default Kubernetes' default one) and ``--job``, judged by the
    rules of the job's metadata: they become parts of local paths."""
    return (
        _field_option(
            "--namespace",
            ("metadata", "namespace"),
            DEFAULT_NAMESPACE if namespace is None else namespace,
        ),
        _field_option("--job", ("metadata", "name"), job),
    )


def _field_option(flag: str, field: Sequence[str], value: str) -> str:
    if problems := text_problems(value) or field_problems(field, value):
        raise OptionError(f"{flag}: {problems[0].message}")
    return value
