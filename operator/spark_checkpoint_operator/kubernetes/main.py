"""The operator's command: ``spark-checkpoint-operator [OPTIONS]`` is Kopf's ``run`` of the
handlers (``kopf run --standalone -m spark_checkpoint_operator.kubernetes.handlers``, with
Kopf's options: ``--all-namespaces``, ``--namespace``, ``--liveness``, ...). An operator that
cannot start (no Kubernetes credentials) exits 1 after the one line its startup logged, not
with Kopf's traceback after it."""

import sys
import warnings
from collections.abc import Sequence

import kopf
from kopf import cli

HANDLERS = "spark_checkpoint_operator.kubernetes.handlers"


def kopf_arguments(argv: Sequence[str]) -> list[str]:
    """Kopf's command line for the operator's arguments ``argv``."""
    return ["run", "--standalone", "-m", HANDLERS, *argv]


def main(argv: Sequence[str] | None = None) -> int:
    arguments = kopf_arguments(sys.argv[1:] if argv is None else argv)
    # Kopf's authenticator is never awaited when the startup fails, which Python reports.
    warnings.filterwarnings("ignore", "coroutine 'authenticator' was never awaited")
    try:
        cli.main(args=arguments, prog_name="spark-checkpoint-operator")
    except Exception as error:
        # A startup handler that failed for good (Kopf raises it as the cause of its own
        # ActivityError) has logged its reason: one line is all there is to say.
        if isinstance(error.__cause__, kopf.PermanentError):
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
