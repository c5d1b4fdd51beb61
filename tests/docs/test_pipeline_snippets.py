"""The docs' pipeline snippets are fragments of a Spark job (they need a streaming DataFrame
and the runtime's environment), so they are checked against the reference pipeline that the
e2e tests run with real PySpark: every statement of a snippet is one of its statements."""

import ast
import contextlib
from pathlib import Path

from helpers.doc_blocks import ROOT, marked_blocks
from spark_checkpoint.sink import TransactionalFileSink

PIPELINE = ROOT / "examples" / "wordcount" / "pipeline.py"
SINK = "TransactionalFileSink"


def _sink_calls(tree: ast.AST) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == SINK
    ]


def _shape(statement: ast.stmt) -> str:
    """The statement with the sink's output directory left out: where the output goes is
    the one thing a snippet chooses for itself."""
    copy = ast.parse(ast.unparse(statement)).body[0]
    for call in _sink_calls(copy):
        call.args = []
    return ast.dump(copy)


def test_pipeline_snippets_are_statements_of_the_reference_pipeline(tmp_path: Path) -> None:
    blocks = marked_blocks(
        "tests/docs/test_pipeline_snippets.py::"
        "test_pipeline_snippets_are_statements_of_the_reference_pipeline"
    )
    pipeline = {
        _shape(node)
        for node in ast.walk(ast.parse(PIPELINE.read_text()))
        if isinstance(node, ast.stmt)
    }
    for block in blocks:
        snippet = ast.parse(block.text, filename=str(block))
        for statement in snippet.body:
            assert _shape(statement) in pipeline, (
                f"{block}: `{ast.unparse(statement)}` is not a statement of "
                f"{PIPELINE.relative_to(ROOT)}, the pipeline the e2e tests run"
            )
        for call in _sink_calls(snippet):
            (argument,) = call.args
            if isinstance(argument, ast.Constant) and "://" in str(argument.value):
                _check_uri_output(block, str(argument.value), tmp_path)


def _check_uri_output(block: object, uri: str, tmp_path: Path) -> None:
    """A URI must be where the sink writes, not the name of a local directory."""
    with contextlib.chdir(tmp_path):
        try:
            sink = TransactionalFileSink(uri)
        except ValueError as error:
            raise AssertionError(f"{block}: {SINK}({uri!r}) is refused: {error}") from None
    assert uri in (sink.output_dir, Path(sink.output_dir).as_uri()), (
        f"{block}: {SINK}({uri!r}) writes into the local directory {sink.output_dir}"
    )
