"""What we read of a streaming query's own logs in its checkpoint location: the entries of
its offset log (``offsets/<B>``) and its file sources' metadata logs (``sources/<s>/``).

One reading for the image planner (which cuts each file source's log where the image's batch
read it), the sink (which fingerprints the files a batch read), and ``verify --deep`` (which
has Spark read each file source's log).
"""

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

BATCH_FILE = re.compile(r"^(\d+)$")
COMPACT_FILE = re.compile(r"^(\d+)\.compact$")
# A file source's log entry lists a file as `{"path":"<uri>",...}`; a Kafka source's initial
# offsets, `{"<topic>":{...}}`, even of a topic named "path".
_LISTED_FILE = re.compile(rb'\{\s*"path"\s*:\s*"')


@dataclass(frozen=True)
class OffsetLogEntry:
    """An entry of Spark's offset log: its format (``v1``: a line per source, in the plan's
    order; ``v2``: ``name:offset`` lines, for named sources) and its offset lines, after the
    version and the batch's metadata (watermark, time, confs)."""

    version: bytes
    offsets: tuple[bytes, ...]


def read_offset_log_entry(location: Path, batch_id: int) -> OffsetLogEntry | None:
    """``offsets/<batch_id>`` of the checkpoint at `location`; None when it cannot be read."""
    try:
        lines = (location / "offsets" / str(batch_id)).read_bytes().splitlines()
    except OSError:
        return None
    if len(lines) < 2:
        return None
    return OffsetLogEntry(lines[0], tuple(lines[2:]))


def source_dirs(location: Path) -> list[str]:
    """Each source's log directory below ``sources/``: numbered as Spark numbers the
    sources, or named (``readStream.name``, with source evolution on); numbered first.
    Raises OSError if ``sources/`` is there and cannot be listed."""
    try:
        with os.scandir(location / "sources") as entries:
            names = [entry.name for entry in entries if _is_dir(entry)]
    except (FileNotFoundError, NotADirectoryError):  # no source has a log yet
        return []
    return sorted(
        (name for name in names if not name.startswith(".")),
        key=lambda name: (not name.isdigit(), int(name) if name.isdigit() else 0, name),
    )


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # as Path.is_dir: a link that cannot be followed is no directory
        return False


def file_source_log_offsets(
    location: Path, entry: OffsetLogEntry, dirs: list[str], *, exact: bool = True
) -> dict[str, int]:
    """Each file source's bound in the offset log `entry`, by its directory's name below
    ``sources/`` (`dirs`, as `source_dirs` lists them): its ``{"logOffset": L}`` (the id
    of its own log's last entry the batch read), or -1 where it read none yet (``-``: any
    entry of its log is a later batch's).

    Spark writes a ``v1`` line for each source of the plan, a source read twice
    (``a.union(a)``) twice, but numbers directories once per source, and some sources
    (rate, socket) keep no directory: line ``i`` is ``sources/<i>``'s for certain only
    when the highest numbered directory is the last line's (with a source read twice,
    none is numbered that high). Otherwise no source is given, or, not `exact`, each line
    ``i`` is taken for ``sources/<i>``'s all the same (a fingerprint of the logs needs only
    be the same for the same logs)."""
    if entry.version == b"v1":
        numbered = [int(name) for name in dirs if name.isdigit()]
        if exact and max(numbered, default=-1) != len(entry.offsets) - 1:
            return {}
        named = [(str(index), text) for index, text in enumerate(entry.offsets)]
    elif entry.version == b"v2":
        named = [
            (name.decode(errors="replace"), text)
            for name, _, text in (line.partition(b":") for line in entry.offsets)
        ]
    else:
        return {}
    found: dict[str, int] = {}
    for name, text in named:
        if name not in dirs:
            continue
        if text == b"-":
            if is_file_source_log(location / "sources" / name):
                found[name] = -1
            continue
        try:
            offset = json.loads(text)
        except (ValueError, RecursionError):
            continue
        if isinstance(offset, dict) and type(offset.get("logOffset")) is int:
            found[name] = offset["logOffset"]
    return found


def is_file_source_log(directory: Path) -> bool:
    """Whether `directory` holds a file source's metadata log: a compaction, or a first
    entry that lists a file (``{"path":"...``); a Kafka source keeps its initial offsets
    there instead (``{"<topic>":{...``)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    if any(COMPACT_FILE.match(name) for name in names):
        return True
    batches = sorted((name for name in names if BATCH_FILE.match(name)), key=int)
    try:
        with open(directory / batches[0], "rb") as first:
            # Bounded: a batch that found many files makes a long entry.
            return bool(_LISTED_FILE.match(first.read(4096).split(b"\n")[1]))
    except (OSError, IndexError):
        return False


def file_source_entries(log: Path, log_id: int) -> list[str] | None:
    """The files (path and modification time, tab-separated) a file source's `log` lists
    under `log_id`: in its file ``<L>`` or, at a compaction, among the entries of
    ``<L>.compact``; None if neither is there or it cannot be read."""
    for name in (str(log_id), f"{log_id}.compact"):
        try:
            lines = (log / name).read_text().splitlines()[1:]  # after the version
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError):
            return None
        entries = []
        for line in lines:
            try:
                entry = json.loads(line)
            except (ValueError, RecursionError):
                return None
            if isinstance(entry, dict) and entry.get("batchId") == log_id:
                entries.append(f"{entry.get('path')}\t{entry.get('timestamp')}")
        return entries
    return None
