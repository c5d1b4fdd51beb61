"""The operator's command, ``spark-checkpoint-operator [OPTIONS]``: Kopf's ``run`` of the
handlers, standalone (``kopf run --standalone -m spark_checkpoint_operator.kubernetes.handlers``),
with those of Kopf's options that mean something for it. An operator that cannot start (no
Kubernetes credentials) exits 1 after the one line its startup logged, not with Kopf's
traceback after it."""

import copy
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import click
import kopf
from kopf import cli

PROGRAM = "spark-checkpoint-operator"
HANDLERS = "spark_checkpoint_operator.kubernetes.handlers"

# Kopf's run options as this command offers them, with their help. Left out: the handlers'
# paths and --standalone (fixed), and what only peering uses (--peering, --priority, --dev:
# standalone, one operator runs without peering).
OPTION_HELP = {
    "verbose": "Log at DEBUG level (the default is INFO).",
    "debug": "Log at DEBUG level, asyncio's messages too.",
    "quiet": "Log at WARNING level.",
    "log_format": "The log lines' format (default: full).",
    "log_refkey": "With --log-format=json: the key under which a line names its object.",
    "log_prefix": (
        "Begin each line about an object with its namespace and name (default: on, off "
        "with --log-format=json)."
    ),
    "clusterwide": (
        "Watch jobs in every namespace (the image's default; Kopf's too, with a warning, "
        "when neither -A nor -n is given)."
    ),
    "namespaces": "Watch jobs in this namespace (repeatable; glob patterns as Kopf's).",
    "liveness_endpoint": "Serve a liveness probe, e.g. http://0.0.0.0:8080/healthz.",
    "modules": (
        "Import this Python module too, after the operator's handlers (repeatable): "
        "it may add handlers or job observers."
    ),
}


def _options() -> list[click.Parameter]:
    options: list[click.Parameter] = []
    for kopf_option in cli.run.params:
        if kopf_option.name in OPTION_HELP:
            option = copy.copy(kopf_option)
            assert isinstance(option, click.Option)
            option.help = OPTION_HELP[kopf_option.name]
            options.append(option)
    return options


@click.pass_context
def _run(context: click.Context, /, modules: tuple[str, ...], **options: Any) -> None:
    try:
        context.invoke(cli.run, paths=(), modules=(HANDLERS, *modules), standalone=True, **options)
    except click.UsageError as error:
        # Kopf's own checks (-A with -n) would show its usage, `run [OPTIONS] [PATHS]`.
        raise click.UsageError(error.message, ctx=context) from None


command = click.Command(
    PROGRAM,
    callback=_run,
    params=_options(),
    help=(
        "Run the operator: watch SparkCheckpointJob resources and run their jobs. Each "
        "option may also come from KOPF_RUN_<NAME> (KOPF_RUN_VERBOSE=1, "
        "KOPF_RUN_LOG_FORMAT=json), as with `kopf run`."
    ),
    # Kopf's group reads KOPF_RUN_* for its run command's options: so does this command.
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "KOPF_RUN"},
)


def main(argv: Sequence[str] | None = None) -> int:
    """Exits with Click's code (0, or 2 for a usage error); returns 1 when the operator
    cannot start."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    # Kopf's authenticator is never awaited when the startup fails, which Python reports.
    warnings.filterwarnings("ignore", "coroutine 'authenticator' was never awaited")
    try:
        command.main(args=arguments, prog_name=PROGRAM)
    except Exception as error:
        # A startup handler that failed for good (Kopf raises it as the cause of its own
        # ActivityError) has logged its reason: one line is all there is to say.
        if isinstance(error.__cause__, kopf.PermanentError):
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
