"""How every runtime starts a pipeline: ``python -m spark_checkpoint.launch <mainFile>
<arguments>`` (or ``-m <module> <arguments>``) runs it as ``python <mainFile>`` would, and
holds it to handing its query to `run_coordinated`.

A pipeline that starts its query itself (``writer.start()``) runs uncoordinated: its agent
never answers, and when it exits 0 its runtime would take that for "finished with a final
checkpoint" and never run it again. One that sets the query's checkpoint location would
find it silently replaced. Each is refused at once, as misconfigured, naming the fix.
"""

import functools
import importlib.util
import os
import runpy
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from pyspark.sql.streaming.readwriter import DataStreamWriter

from spark_checkpoint import driver
from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint.user_entry import provide_user_entry

USAGE = "usage: python -m spark_checkpoint.launch (MAIN_FILE | -m MODULE) [ARGUMENT ...]"
HAND_OVER = "hand the writer to spark_checkpoint.driver.run_coordinated(writer, participants=[...])"


def main(argv: list[str]) -> NoReturn:
    provide_user_entry()  # before anything starts the JVM, which needs one
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        sys.exit(USAGE)
    _guard_the_writer()
    try:
        if argv[0] == "-m":
            _run_module(argv[1], argv[2:])
        else:
            _run_file(argv[0], argv[1:])
    except SystemExit as exit_:
        if driver.run_coordinated_called() or exit_.code not in (0, None):
            raise
    if driver.run_coordinated_called():
        sys.exit(
            _refuse(
                "the pipeline caught the SystemExit that run_coordinated ends the driver with "
                "(how its query ended is lost): let it through"
            )
        )
    sys.exit(
        _refuse(
            "the pipeline ended without calling run_coordinated: nothing of it was "
            f"checkpointed, and an exit 0 would read as finished; {HAND_OVER}"
        )
    )


def _run_file(main_file: str, arguments: list[str]) -> None:
    path = Path(main_file)
    if not (path.is_file() or (path / "__main__.py").is_file()):
        sys.exit(_refuse(f"mainFile {main_file}: no such file"))
    # As `python <mainFile>`: the script's directory comes first on the path, in place of
    # the launcher's (a directory or zip archive: run_path puts itself there), and
    # `__file__` is absolute (so is `sys.argv[0]`: run_path sets both).
    if path.is_dir() or zipfile.is_zipfile(path):
        del sys.path[0]
    else:
        sys.path[0] = str(path.resolve().parent)
    sys.argv = [main_file, *arguments]
    runpy.run_path(os.path.abspath(main_file), run_name="__main__")


def _run_module(module: str, arguments: list[str]) -> None:
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package that is missing, an empty name
        found = None
    if found is None:
        sys.exit(_refuse(f"module {module}: no such module on the path"))
    sys.argv = [module, *arguments]  # run_module puts the module's file first
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _guard_the_writer() -> None:
    """What `run_coordinated` does for the pipeline, the pipeline may not do before it:
    start the query or choose its checkpoint location. Either ends the driver as
    misconfigured at once, before Spark plans anything."""
    for name in ("start", "toTable"):
        _guard(name, _starts_the_query(name))
    _guard("option", lambda args, kwargs: _sets_location([_option_key(args, kwargs)]))
    _guard("options", lambda _, kwargs: _sets_location(list(kwargs)))


# Whether a call of a writer's method, given its arguments, does what the pipeline may not.
Problem = Callable[[tuple[Any, ...], dict[str, Any]], str | None]


def _starts_the_query(name: str) -> Problem:
    message = (
        f"the pipeline starts its query with DataStreamWriter.{name}(): {HAND_OVER}, which "
        "starts it coordinated"
    )
    return lambda _args, _kwargs: message


def _option_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    """The key of ``DataStreamWriter.option(self, key, value)``."""
    return kwargs["key"] if "key" in kwargs else args[1] if len(args) > 1 else None


def _sets_location(keys: list[object]) -> str | None:
    # Spark's option keys are case-insensitive.
    if not any(str(key).lower() == driver.CHECKPOINT_LOCATION.lower() for key in keys):
        return None
    return (
        f"the pipeline sets the query's {driver.CHECKPOINT_LOCATION}: leave it out; "
        "run_coordinated starts each attempt in a fresh one, restored from the job's "
        "newest image"
    )


def _guard(name: str, problem: Problem) -> None:
    method = getattr(DataStreamWriter, name)

    @functools.wraps(method)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if not driver.run_coordinated_called() and (found := problem(args, kwargs)):
            sys.exit(_refuse(found))
        return method(*args, **kwargs)

    setattr(DataStreamWriter, name, guarded)


def _refuse(message: str) -> DriverExit:
    driver.configure_logging()
    return driver.fail_with(message, DriverExit.MISCONFIGURED)


if __name__ == "__main__":
    main(sys.argv[1:])
