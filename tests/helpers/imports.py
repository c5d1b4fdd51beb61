"""What a new Python process loads: a command's start-up cost shows as the modules it
imports."""

import subprocess
import sys


def modules_loaded_by(*modules: str) -> set[str]:
    """The names in ``sys.modules`` of a new interpreter once it imported ``modules``."""
    code = f"import sys, {', '.join(modules)}; print('\\n'.join(sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return set(loaded.stdout.split())
