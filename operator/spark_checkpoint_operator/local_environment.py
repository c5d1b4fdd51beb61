"""The environment a local driver runs with, which the runtime's and the storage commands'
own storage work uses too: an object store's endpoint, region or credentials may be the
manifest's variables."""

import contextlib
import os
import sys
from collections.abc import Iterator

from spark_checkpoint_operator.manifest.model import JobManifest


def driver_environment(manifest: JobManifest) -> dict[str, str]:
    """The run's environment and the manifest's literal variables, the executors' too
    (`JobSpec.local_env`; a Secret's are the run's own, `require_secret_variables`):
    storage credentials may be in either."""
    return {
        # Spark's Python workers (pandas UDFs, applyInPandasWithState) run the driver's
        # interpreter, so they see the packages the driver sees, unless told otherwise.
        "PYSPARK_PYTHON": sys.executable,
        **os.environ,
        **{v.name: v.value for v in manifest.spec.local_env if v.secret is None},
    }


@contextlib.contextmanager
def driver_environment_here(manifest: JobManifest) -> Iterator[None]:
    """This process with the driver's environment, to read the storage as the driver does
    (and the subprocesses it starts meanwhile)."""
    saved = dict(os.environ)
    os.environ.update(driver_environment(manifest))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
