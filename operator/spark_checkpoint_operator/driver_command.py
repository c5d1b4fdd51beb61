"""How a driver is started and stopped, the same on every runtime: the Python command of
the application, the Spark configuration PySpark's launcher reads from the environment, and
how long a driver is given to exit once it is told to stop."""

import shlex
from collections.abc import Mapping

from spark_checkpoint_operator.manifest.model import Application

LOCAL_SCHEME = "local://"
# The data plane's module every driver runs its application through (it holds the
# application to `run_coordinated`).
LAUNCHER_MODULE = "spark_checkpoint.launch"
# How long a driver told to stop (SIGTERM) may take to exit before it is killed (SIGKILL):
# a pod's terminationGracePeriodSeconds, a local driver's wait. Spark's shutdown hooks
# (stopping the context, closing the agent) must fit.
TERMINATION_GRACE_SECONDS = 60


def driver_command(application: Application, python: str = "python") -> list[str]:
    """``python <mainFile> <args>`` or ``python -m <module> <args>``, through the launcher.
    A ``local://`` main file is a path inside the image, as Spark spells it."""
    command = [python, "-m", LAUNCHER_MODULE]
    if application.module:
        command += ["-m", application.module]
    else:
        assert application.main_file is not None
        command.append(application.main_file.removeprefix(LOCAL_SCHEME))
    return command + list(application.arguments)


def submit_arguments(spark_conf: Mapping[str, str]) -> str:
    """``PYSPARK_SUBMIT_ARGS``: every setting as ``--conf``, so that settings the JVM needs
    at start (driver memory, extra class path) apply too."""
    parts = [f"--conf {shlex.quote(f'{k}={v}')}" for k, v in sorted(spark_conf.items())]
    return " ".join([*parts, "pyspark-shell"])
