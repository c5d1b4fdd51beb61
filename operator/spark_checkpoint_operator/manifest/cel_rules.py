"""The `cel` package (CEL, the CRD's validation rules), without the interactive command line
its package imports: typer, rich and prompt_toolkit cost 0.12 s of CPU at the start of every
`spark-checkpoint` command (a sixth of it) and of the operator, and nothing here uses them."""

import sys
import types

sys.modules.setdefault("cel.cli", types.ModuleType("cel.cli"))

import cel  # noqa: E402

__all__ = ["cel"]
