"""Kopf handler shapes that matter: Kopf runs plain functions in a thread pool, where the
controllers' asyncio events must not be touched."""

import inspect

from helpers.imports import modules_loaded_by
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
    operator's start; `core_api` makes the few calls the operator needs. (Custom objects
    take no models, the Coordination API's Leases a handful.)"""
    loaded = modules_loaded_by("spark_checkpoint_operator.kubernetes.handlers")
    generated = sorted(name for name in loaded if name.startswith("kubernetes.aio.client.api."))
    assert generated == [
        "kubernetes.aio.client.api.coordination_v1_api",
        "kubernetes.aio.client.api.custom_objects_api",
    ], generated
