"""``checkpointing.verifyRestorable`` on this machine: each completed image is read by Spark
as a restart reads it, in a data-plane subprocess (``python -m spark_checkpoint.restorable``;
the control plane never imports pyspark)."""

import asyncio
import contextlib
import sys
from collections.abc import Mapping

from spark_checkpoint.restorable_report import problems_by_image
from spark_checkpoint.storage import JobStorageLayout
from spark_checkpoint_operator.child_process import dying_with_parent
from spark_checkpoint_operator.manifest.model import JobManifest
from spark_checkpoint_operator.supervisor import CheckUnavailable


def restorable_command(layout: JobStorageLayout, images: list[str]) -> list[str]:
    """The data plane's restorable check of ``images`` (``kind:id``) in ``layout``."""
    return [
        sys.executable,
        "-m",
        "spark_checkpoint.restorable",
        f"--storage={layout.root}",
        f"--namespace={layout.namespace}",
        f"--job={layout.job}",
        *images,
    ]


class LocalRestorableCheck:
    """Runs the check as a subprocess of the runtime, with the driver's environment (its
    storage credentials)."""

    def __init__(self, layout: JobStorageLayout, environment: Mapping[str, str]) -> None:
        self._layout = layout
        self._environment = dict(environment)

    async def problems(self, image: str) -> list[str]:
        try:
            process = await asyncio.create_subprocess_exec(
                # A run killed mid-check leaves no Spark session behind.
                *dying_with_parent(restorable_command(self._layout, [image])),
                env=self._environment,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as error:
            raise CheckUnavailable(str(error)) from error
        try:
            stdout, stderr = await process.communicate()
        finally:
            if process.returncode is None:  # cancelled: the job ended
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        try:
            return problems_by_image(stdout.decode(errors="replace"))[image]
        except (ValueError, KeyError):
            errors = stderr.decode(errors="replace").strip().splitlines()
            raise CheckUnavailable(
                errors[-1] if errors else f"exit code {process.returncode}"
            ) from None


def local_restorable_check(
    manifest: JobManifest, layout: JobStorageLayout, environment: Mapping[str, str]
) -> LocalRestorableCheck | None:
    """The check of a local run; None (no check) unless checkpointing.verifyRestorable."""
    if not manifest.spec.checkpointing.verify_restorable:
        return None
    return LocalRestorableCheck(layout, environment)
