"""Kopf handler shapes that matter: Kopf runs plain functions in a thread pool, where the
controllers' asyncio events must not be touched."""

import inspect
import subprocess
import sys

from spark_checkpoint_operator.kubernetes import handlers


def test_every_handler_runs_on_the_event_loop() -> None:
    for handler in (
        handlers.configure,
        handlers.close,
        handlers.pod_changed,
        handlers.job_changed,
        handlers.run_job,
        handlers.delete_job,
    ):
        assert inspect.iscoroutinefunction(handler), handler.__name__


def test_the_operator_loads_no_generated_api_class_of_the_core_group() -> None:
    """The client's `CoreV1Api` loads every model of the Core v1 API on import, half of the
    operator's start; `core_api` makes the few calls the operator needs."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, spark_checkpoint_operator.kubernetes.handlers; "
            "print(sorted(m for m in sys.modules if m.startswith('kubernetes.aio.client.api.')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout == "['kubernetes.aio.client.api.custom_objects_api']\n", loaded.stdout
