"""Kopf handler shapes that matter: Kopf runs plain functions in a thread pool, where the
controllers' asyncio events must not be touched."""

import inspect

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
