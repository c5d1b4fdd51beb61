"""A real checkpoint agent serving over HTTP on a free port, against a synthetic live
checkpoint location (no Spark), with a sink participant that records its notifications."""

import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.ports import free_port
from spark_checkpoint.agent.agent import CheckpointAgent, QueryView
from spark_checkpoint.agent.server import AgentServer
from spark_checkpoint.protocol import ErrorAnswer, QueryState
from spark_checkpoint.storage import CheckpointStorage, JobStorageLayout
from spark_checkpoint_operator.agent_client import AgentClient

TOKEN = "s3cret-token"


class RecordingParticipant:
    """A two-phase-commit sink's stand-in: what it was told to commit."""

    def __init__(self) -> None:
        self.completed: list[int] = []
        self.restored: list[int | None] = []

    def on_checkpoint_complete(self, batch_id: int) -> None:
        self.completed.append(batch_id)

    def on_restore(
        self, restored_batch: int | None, job: str, *, checkpoint_location: object = None
    ) -> None:
        self.restored.append(restored_batch)


def live_location(root: Path, batches: int) -> Path:
    location = root / "live"
    files = {"metadata": json.dumps({"id": "0b7c6a0e-query"})}
    for b in range(batches):
        files |= {f"offsets/{b}": f"offsets {b}", f"commits/{b}": f"commit {b}"}
        files |= {f"sources/0/{b}": f"source {b}"}
        for p in range(2):
            files[f"state/0/{p}/{b + 1}.delta"] = f"delta {p} {b + 1}" * 50
    for relative, text in files.items():
        (location / relative).parent.mkdir(parents=True, exist_ok=True)
        (location / relative).write_text(text)
    return location


class Running:
    def __init__(
        self,
        tmp_path: Path,
        batches: int = 3,
        storage_root: str | None = None,
        *,
        query_started: bool = True,
        host: str = "127.0.0.1",
    ) -> None:
        self.root = tmp_path
        self.location = live_location(tmp_path, batches)
        self.storage = CheckpointStorage(
            JobStorageLayout(
                storage_root or (tmp_path / "storage").as_uri(), "default", "wordcount"
            )
        )
        self.participant = RecordingParticipant()
        self.view = QueryView(QueryState.RUNNING)
        self.drained = True  # what a drain asks of the query: all input processed
        self.agent = CheckpointAgent(
            storage=self.storage,
            location=self.location,
            pin_root=tmp_path / "pins",
            participants=[self.participant],
            attempt=1,
        )
        if query_started:
            self.agent.query_started(lambda: self.view, None, lambda moment: self.drained)
        self.port = free_port()
        self.server = AgentServer(self.agent, TOKEN, host, self.port)

    def client(self, token: str = TOKEN) -> AgentClient:
        return AgentClient(f"http://127.0.0.1:{self.port}", token)

    def side_effects(self) -> tuple[Any, ...]:
        """Everything a request could change: stored and live files, what the sinks were
        told, the snapshots in flight, the stop request and the notified watermark."""
        files = tuple(
            sorted(
                (str(path.relative_to(self.root)), path.stat().st_size)
                for directory in (self.root / "storage", self.location)
                for path in directory.rglob("*")
                if path.is_file()
            )
        )
        status = self.agent.status()
        in_flight = tuple((s.checkpoint_id, s.state) for s in status.checkpoints)
        return (
            files,
            tuple(self.participant.completed),
            in_flight,
            self.agent.stop_requested,
            status.awaiting_final_checkpoint,
        )


@dataclass(frozen=True)
class RawAnswer:
    status: int
    headers: bytes
    body: bytes

    def error(self) -> str:
        """The ``error`` of a JSON error answer."""
        return ErrorAnswer.from_json(json.loads(self.body)).message


def raw_request(
    port: int,
    method: bytes,
    path: bytes,
    body: bytes = b"",
    *,
    headers: tuple[tuple[bytes, bytes], ...] = (),
    token: bytes | None = TOKEN.encode(),
) -> RawAnswer:
    """One HTTP/1.1 request written byte for byte, so any header value and any body can be
    sent (an HTTP client library would refuse or re-encode some)."""
    lines = [b"%s %s HTTP/1.1" % (method, path), b"Host: 127.0.0.1", b"Connection: close"]
    lines.append(b"Content-Length: %d" % len(body))
    if token is not None:
        lines.append(b"Authorization: Bearer " + token)
    lines.extend(name + b": " + value for name, value in headers)
    with socket.create_connection(("127.0.0.1", port), timeout=20) as connection:
        connection.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, content = answer.partition(b"\r\n\r\n")
    status_line, _, answer_headers = head.partition(b"\r\n")
    return RawAnswer(int(status_line.split()[1]), answer_headers, content)
