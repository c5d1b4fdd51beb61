"""The ``spark-checkpoint`` console script. Importing the command line takes a second or
more (the manifest's schema checker among it): a Ctrl-C meanwhile, or in a command that
has no Ctrl-C of its own (`run` has: a savepoint, then stop), ends it quietly with the
code a shell reports for it, not with a traceback."""

import sys

from spark_checkpoint_operator.exit_codes import ExitCode


def main() -> int:
    try:
        # Here, not at the top: a Ctrl-C while it is imported is caught.
        from spark_checkpoint_operator.cli import main as command_line  # noqa: PLC0415

        return command_line()
    except KeyboardInterrupt:
        print(file=sys.stderr)  # the terminal's ^C is left on a line of its own
        return ExitCode.CANCELLED
