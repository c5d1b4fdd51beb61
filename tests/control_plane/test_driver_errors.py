"""The error a driver reports (`report_error`) and how a runtime reads it back
(`driver_error`): what reaches status.message and events, and what the rule of "the same
error twice" compares."""

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.fake_query import FakeQueryFailure
from spark_checkpoint.settings import (
    ERROR_FILE_VARIABLE,
    QUERY_DESCRIPTION,
    REPORTED_ERROR_LINES,
    TERMINATION_MESSAGE_BYTES,
    report_error,
)
from spark_checkpoint_operator.supervisor import driver_error
from spark_checkpoint_operator.supervisor.driver_errors import passes, same_error


def _reported(tmp_path: Path, message: str) -> str:
    error_file = tmp_path / "error"
    report_error(message, {ERROR_FILE_VARIABLE: str(error_file)})
    return error_file.read_text()


def test_a_spark_failure_reads_back_as_its_error_line_without_frames_or_plan(
    tmp_path: Path,
) -> None:
    failure = str(FakeQueryFailure("no such column 'k'")).split(QUERY_DESCRIPTION)[0]
    read = driver_error(_reported(tmp_path, f"query failed: {failure}"), killed=False)
    assert len(read) == 1
    assert read[0].startswith("query failed: [STREAM_FAILED] Query [id = ")
    assert read[0].endswith("(10.0.0.5 executor driver): no such column 'k'")


def test_a_reported_error_is_read_even_from_a_killed_driver(tmp_path: Path) -> None:
    reported = _reported(tmp_path, "cannot start: the output holds batches")
    assert driver_error(reported, killed=True) == ["cannot start: the output holds batches"]
    assert driver_error("WARN still copying\n", killed=True) == []
    assert driver_error("ERROR lost the connection\n", killed=False) == [
        "ERROR lost the connection"
    ]


def test_continuation_lines_are_kept_up_to_a_few() -> None:
    lines = [f"line {i}" for i in range(10)]
    assert (
        driver_error("\n".join(["error reported by run_coordinated:", *lines]), killed=False)
        == lines[:6]
    )


@given(st.lists(st.text(st.characters(codec="utf-8"), max_size=3000), max_size=8))
def test_any_report_fits_a_termination_message_and_reads_back_as_its_head(
    lines: list[str],
) -> None:
    """Kubernetes keeps a file's last 4096 bytes: the report fits whole, so what is read
    is the error's first line (cut on a character if it alone is too long)."""
    message = "\n".join(lines)
    with tempfile.TemporaryDirectory() as directory:
        error_file = Path(directory, "error")
        report_error(message, {ERROR_FILE_VARIABLE: str(error_file)})
        written = error_file.read_bytes()
    assert len(written) <= TERMINATION_MESSAGE_BYTES
    read = driver_error(written.decode(), killed=True)
    assert len(read) <= REPORTED_ERROR_LINES
    first = message.strip().splitlines()[:1]
    if first and first[0].strip():
        assert read and first[0].rstrip().startswith(read[0])


def test_without_a_file_to_write_nothing_is_reported_and_nothing_fails(tmp_path: Path) -> None:
    report_error("x", {})
    report_error("x", {ERROR_FILE_VARIABLE: str(tmp_path / "missing" / "error")})
    assert list(tmp_path.iterdir()) == []


def test_a_report_is_never_written_through_a_symbolic_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim.rc"
    victim.write_text("the user's file\n")
    (tmp_path / "error").symlink_to(victim)

    report_error("x", {ERROR_FILE_VARIABLE: str(tmp_path / "error")})

    assert victim.read_text() == "the user's file\n"


def test_the_same_failure_in_two_attempts_differs_only_in_spark_run_ids() -> None:
    first = ["query failed: Query [id = 1, runId = 5c0d6f5e-1bd4-4f0c-9a51-0f2f5d3c8e11]: x"]
    second = ["query failed: Query [id = 1, runId = 0b6c3a52-6f1d-4a57-9d0c-6c1b8f1d2e3f]: x"]
    assert same_error(first, second)
    assert not same_error(first, ["query failed: Query [id = 1, runId = 0]: y"])
    # A state store's path names the attempt's checkpoint location.
    in_attempt = "[CANNOT_LOAD_STATE_STORE] at file:/w/attempt-{}/checkpoint/state/0/1"
    assert same_error([in_attempt.format(3)], [in_attempt.format(4)])
    assert not same_error([], [])


# As PySpark 4 passes on an exception a UDF raised (its log, trimmed).
UDF_FAILURE = (
    (
        "[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most "
        "recent call last):\n"
    )
    + """\
  File "/jobs/orders/pipeline.py", line 21, in check_word
    raise ValueError(f"unexpected word {w!r} in input")
ValueError: unexpected word 'kassun' in input
 SQLSTATE: 38000"""
)
# And one a foreachBatch function met: py4j's traceback, then the worker's, chained.
FOREACH_BATCH_FAILURE = """\
An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/pyspark/errors/exceptions/captured.py", line 262, in deco
    raise converted from None
pyspark.errors.exceptions.captured.PythonException: An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/jobs/orders/pipeline.py", line 21, in check_word
    raise KeyError("kassun")
KeyError: 'kassun'
"""


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            UDF_FAILURE,
            "query failed: [PYTHON_EXCEPTION] An exception was thrown from the Python worker: "
            "ValueError: unexpected word 'kassun' in input",
        ),
        (
            FOREACH_BATCH_FAILURE,
            "query failed: An exception was raised by the Python Proxy. Return Message: "
            "KeyError: 'kassun'",
        ),
        (
            "RuntimeError: lost\n\nDuring handling of the above exception, another exception "
            'occurred:\n\nTraceback (most recent call last):\n  File "x.py", line 1\nOSError: '
            "disk full",
            "query failed: RuntimeError: lost",
        ),
    ],
)
def test_an_error_of_python_code_in_the_query_names_its_exception(
    tmp_path: Path, message: str, expected: str
) -> None:
    """Two different exceptions of a UDF must not read as the same failure."""
    read = driver_error(_reported(tmp_path, f"query failed: {message}"), killed=False)
    assert read[0] == expected


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        # `python pipeline.py` of a file Python cannot compile: no traceback header.
        (
            '  File "/app/pipeline.py", line 8\n    df = (\n         ^\n'
            "SyntaxError: '(' was never closed\n",
            "SyntaxError: '(' was never closed (/app/pipeline.py, line 8)",
        ),
        # A module it imports, inside a traceback.
        (
            'Traceback (most recent call last):\n  File "/app/pipeline.py", line 3, in '
            '<module>\n    import helpers\n  File "/app/helpers.py", line 7\n    def f(:\n'
            "          ^\nSyntaxError: invalid syntax\n",
            "SyntaxError: invalid syntax (/app/helpers.py, line 7)",
        ),
    ],
)
def test_a_syntax_error_names_where_the_code_is_wrong(output: str, expected: str) -> None:
    # A newcomer's summary read "SyntaxError: '(' was never closed" alone.
    assert driver_error(output, killed=False) == [expected]


@pytest.mark.parametrize(
    ("error", "passing"),
    [
        (
            "spark_checkpoint.storage.errors.StorageAccessError: s3://b/k: "
            "EndpointConnectionError: Could not connect to the endpoint URL",
            True,
        ),
        ("OSError: [Errno 111] Connection refused", True),
        ("botocore.exceptions.ClientError: An error occurred (SlowDown) when calling", True),
        ("botocore.exceptions.ClientError: An error occurred (503) when calling", True),
        ("java.net.SocketException: Connection reset", True),
        (
            "org.apache.kafka.common.errors.TimeoutException: Timeout expired while fetching "
            "topic metadata",
            True,
        ),
        ("azure.core.exceptions.ServiceRequestError: Failed to establish a connection", True),
        # What a pipeline or its settings get wrong, retried in vain (a reviewer's).
        ("java.lang.InternalError: a fault in the JVM", False),
        ("TimeoutError: the pipeline's own", False),
        ("java.util.concurrent.TimeoutException: Futures timed out after [300 seconds]", False),
        ("java.net.UnknownHostException: mybukcet.s3.amazonaws.com", False),
        ("AnalysisException: column SlowDown does not exist", False),
        ("[INTERNAL_ERROR] The Spark SQL phase planning failed", False),
        ("ValueError: no such column 'k'", False),
    ],
)
def test_errors_of_storage_and_the_network_that_pass_are_told_apart(
    error: str, passing: bool
) -> None:
    assert passes([error]) is passing
