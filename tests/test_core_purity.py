"""The core is a pure state machine: it imports only itself, the wire contract's module
and the standard library without I/O. import-linter's contract (.importlinter) can only
forbid names it is given; this holds the core to what it may import, whatever package the
project adds."""

import sys

import grimp

from spark_checkpoint import protocol
from spark_checkpoint_operator import coordinator

# The standard library's modules that reach files, processes, the network or the clock.
IO_MODULES = frozenset(
    {
        "asyncio",
        "concurrent",
        "fcntl",
        "http",
        "io",
        "mmap",
        "multiprocessing",
        "os",
        "pathlib",
        "select",
        "selectors",
        "shutil",
        "signal",
        "socket",
        "sqlite3",
        "ssl",
        "subprocess",
        "sys",
        "tempfile",
        "threading",
        "time",
        "urllib",
    }
)


def test_the_core_imports_only_itself_the_wire_contract_and_the_standard_library_without_io() -> (
    None
):
    graph = grimp.build_graph(
        "spark_checkpoint_operator", "spark_checkpoint", include_external_packages=True
    )
    core = graph.find_children(coordinator.__name__) | {coordinator.__name__}
    imported = {name for module in core for name in graph.find_modules_directly_imported_by(module)}

    outside = {
        name
        for name in imported - core
        if name != protocol.__name__
        and name.split(".")[0] not in sys.stdlib_module_names - IO_MODULES
    }
    assert outside == set()
