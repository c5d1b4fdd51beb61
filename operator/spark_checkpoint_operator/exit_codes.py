"""The exit codes of ``spark-checkpoint``, apart from the command line's modules: the
console script (`command`) ends with one before it has imported them."""

from enum import IntEnum


class ExitCode(IntEnum):
    """Each command's ``--help`` says what each of the codes it uses means for it."""

    OK = 0
    FAILED = 1
    USAGE = 2  # also what argparse exits with on a bad command line
    NO_RUNTIME = 3
    DECLINED = 4
    REFUSED = 5
    CANCELLED = 130  # 128 + SIGINT: what a shell reports for a Ctrl-C'd command
    # 128 + SIGPIPE: what a shell reports for a C or Go program (kubectl) whose reader
    # closed the pipe; Python would print a traceback instead.
    CLOSED_PIPE = 141
