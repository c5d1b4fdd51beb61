"""The error a driver ended with, read from what it wrote last: the error it reported
(`spark_checkpoint.settings.report_error`), else its log's end (a local driver's log, a
driver pod's termination message by FallbackToLogsOnError). Shown with each failure, and
compared to tell a failure that repeats."""

import itertools
import re
import signal

from spark_checkpoint.exit_codes import STORAGE_UNAVAILABLE
from spark_checkpoint.settings import PYTHON_TRACEBACK, REPORTED_ERROR_HEADER

ERROR_LINES_SHOWN = 6
# What a driver's error may carry that differs in each attempt: Spark's query runId, and
# the attempt's own checkpoint location (`work/attempt-<n>/checkpoint`, in a state store's
# path).
PER_ATTEMPT = re.compile(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}|attempt-\d+")
# What another process sends to end a driver (the kernel's OOM killer, an eviction, a
# deletion): the end of its log is then whatever it was doing, not an error of its own.
KILLING_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM})
ERROR_WORDS = re.compile(r"error|exception|fatal|can't|cannot", re.IGNORECASE)
AFTER_THE_ERROR = re.compile(r"=== |(INFO|DEBUG|WARN|WARNING) ")
SYNTAX_ERROR = re.compile(r"(SyntaxError|IndentationError|TabError): ")
PYTHON_PLACE = re.compile(r'^\s*File "([^"]+)", line (\d+)', re.MULTILINE)
# When a log line was written (Python's logging, Spark's log4j): not part of the error, and
# it would make the same error of two attempts differ.
LOG_TIME = re.compile(
    r"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}([,.]\d+)?|\d{2}/\d{2}/\d{2} \d{2}:\d{2}:\d{2})\s+"
)


def driver_error(output: str, *, killed: bool) -> list[str]:
    """The error in the end of a driver's output, the error itself first: the error it
    reported (`report_error`), else, unless it was `killed` by one of `KILLING_SIGNALS`, the
    exception of its last Python traceback (without the frames), else the last line that
    reads as an error and what follows it; at most a few lines."""
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    if lines[:1] == [REPORTED_ERROR_HEADER]:
        return lines[1 : 1 + ERROR_LINES_SHOWN]
    if killed:
        return []
    if PYTHON_TRACEBACK in lines:
        start = len(lines) - lines[::-1].index(PYTHON_TRACEBACK)
        frames = 0
        while start + frames < len(lines) and lines[start + frames][:1].isspace():
            frames += 1
        error = lines[start + frames :]
    else:
        marked = [i for i, line in enumerate(lines) if ERROR_WORDS.search(line)]
        if not marked:
            # No error to tell: the output's last lines, as written (their times keep them
            # from passing for the same error as another attempt's).
            return lines[-ERROR_LINES_SHOWN:]
        error = lines[marked[-1] :]
    error = [LOG_TIME.sub("", line, count=1) for line in error]
    # Spark appends the failed query's description, and the driver logs on as it ends:
    # neither is part of the error.
    shown = error[:1] + list(
        itertools.takewhile(lambda line: not AFTER_THE_ERROR.match(line), error[1:])
    )
    if SYNTAX_ERROR.match(shown[0]) and (places := PYTHON_PLACE.findall(output)):
        # Where the code is wrong: Python prints it above the error, among the frames.
        file, line = places[-1]
        shown[0] = f"{shown[0]} ({file}, line {line})"
    return shown[:ERROR_LINES_SHOWN]


# Errors of storage and the network that pass (an endpoint down, a timeout, throttling, a
# server error, an expired session token), by the names botocore, aiohttp, Azure's SDK,
# Python, Kafka's and Hadoop's clients give them: a driver failing twice with one is no
# pipeline to fix.
PASSING_ERROR = re.compile(
    r"\b(EndpointConnectionError|ConnectTimeoutError|ReadTimeoutError|ConnectionClosedError"
    r"|ConnectionRefusedError|ConnectionResetError|ConnectionAbortedError|BrokenPipeError"
    r"|RemoteDisconnected|ClientConnectorError|ServerDisconnectedError|ServerTimeoutError"
    r"|ServiceRequestError|ServiceResponseError|ExpiredToken\w*|RequestTimeTooSkewed"
    r"|SocketTimeoutException|ConnectException|AWSStatus500Exception|AWSServiceThrottledException"
    r"|Throttling\w*|TooManyRequests|ServerBusy|OperationTimedOut)\b"
    # A store's error code in botocore's words: "An error occurred (SlowDown) when calling".
    r"|\((SlowDown|ServiceUnavailable|RequestTimeout|InternalError|500|502|503|504)\)"
    r"|kafka\.common\.errors\.TimeoutException|Timeout expired while fetching topic metadata"
    r"|Connection refused|Connection reset|Connection timed out"
    r"|Could not connect to the endpoint|Temporary failure in name resolution"
    rf"|^{re.escape(STORAGE_UNAVAILABLE)}\b"
)


def passes(error: list[str]) -> bool:
    """Whether a driver's error (`driver_error`) is one of storage or the network that
    passes (`PASSING_ERROR`), by its first line."""
    return bool(error) and PASSING_ERROR.search(error[0]) is not None


def same_error(error: list[str], other: list[str]) -> bool:
    """Whether two attempts' errors (`driver_error`) are the same failure: their first
    lines, ids and checkpoint locations aside."""
    return bool(error and other) and PER_ATTEMPT.sub("<id>", error[0]) == PER_ATTEMPT.sub(
        "<id>", other[0]
    )
