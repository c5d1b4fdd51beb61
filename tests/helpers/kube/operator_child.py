"""The operator's command (what its console script runs: ``main()`` of
``spark_checkpoint_operator.kubernetes.main``) in a child of a fork server that imported the
operator once. Each start of the command imported Kopf, the ``kubernetes`` client and the
operator's handlers again, ~2 CPU-s before its first request: the suite starts the operator
hundreds of times. The artifact's own start, the installed console script, runs in the
wheel's and the image's tests and in ``tests/kubernetes/test_operator_without_cluster.py``.

Kept small: the fork server imports this module, so what it imports is what every start
shares. The preloaded modules that read the environment as they are imported (a scan of
their module-level code): the two Kubernetes clients' kubeconfig modules (KUBECONFIG), which
each start imports again; the C-extension switches of aiohttp, yarl, multidict, frozenlist
and propcache; fsspec's FSSPEC_* configuration. The suite varies only KUBECONFIG."""

import importlib
import multiprocessing
import os
import sys
from collections.abc import Mapping, Sequence

import kubernetes.aio.config.kube_config
import kubernetes.config.kube_config

from spark_checkpoint_operator.kubernetes import handlers, main

# Imported by the fork server before its first fork: every start inherits them.
PRELOADED = (main.__name__, handlers.__name__, __name__)
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(list(PRELOADED))


def start(
    arguments: Sequence[str], environment: Mapping[str, str], log_path: str
) -> "multiprocessing.process.BaseProcess":
    """The command with ``arguments`` started as a process of its own (its own session,
    ``environment`` its whole environment, stdout and stderr appended to ``log_path``),
    as ``subprocess.Popen`` would start it."""
    process = _CONTEXT.Process(
        target=_run, args=(list(arguments), dict(environment), log_path), daemon=True
    )
    process.start()
    return process


def _run(arguments: list[str], environment: dict[str, str], log_path: str) -> None:
    # First: whatever goes wrong from here is in the operator's log.
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    os.setsid()
    os.environ.clear()
    os.environ.update(environment)
    # Both Kubernetes clients (Kopf's login's, the operator's) take their default kubeconfig
    # from KUBECONFIG as they are imported: again, as in a process with this environment.
    importlib.reload(kubernetes.config.kube_config)
    importlib.reload(kubernetes.aio.config.kube_config)
    sys.argv = [main.PROGRAM, *arguments]
    sys.exit(main.main(arguments))
