"""The docs run: every code block of README.md and of the Markdown pages under docs/,
benchmarks/, charts/ and examples/ is run by a test, or says why it cannot be.

Each block in a language a reader can run or apply (shell, Python, YAML, JSON, Dockerfile)
is one of:

(a) run here, without a marker:
    - ``python``: executed in a fresh interpreter of the project's venv, from an empty
      temporary directory;
    - ``sh``/``bash``/``shell``/``console``: run by ``bash -euo pipefail`` in a temporary
      directory holding a copy of ``examples/`` and ``crds/``, with the venv's ``bin/``
      (so the installed ``spark-checkpoint``) first on ``PATH``; in ``console`` blocks only
      the ``$ `` lines are commands; a block using kubectl, helm, kopf or docker is never
      run (it could reach a real cluster or registry) and needs (b) or (c);
    - ``yaml``: every document is applied as the API server would check it: a
      ``SparkCheckpointJob`` through the project's manifest loader (the CRD's schema and
      CEL rules), a built-in Kubernetes object through kubernetes-validate (strict);
    - ``json``: a ``_metadata`` document (it has ``format_version``) through the storage
      format's reader; other JSON has no schema to be checked against, so it needs (c);
    - ``dockerfile``: needs (c) or (b) (no Docker engine in the tests);
(b) ``<!-- illustrative: <reason> -->`` on the line directly above the fence: not run, for
    the stated reason (a cluster-only command, minutes of Spark that an e2e test covers);
(c) ``<!-- tested-by: tests/<path>.py::<test> -->`` on the line directly above the fence:
    that test reads the block from the doc (``helpers.doc_blocks.marked_blocks``) and runs
    or checks it, so doc and test cannot drift apart. The tests of tests/docs/ do this for
    the CLI's storage commands, the pipeline snippets, the agent protocol's JSON, the
    cluster commands (helm, kubectl, kopf), the image examples, the benchmarks' commands
    and README's make commands.

A block that is none of these fails here with its file and line. Blocks with no language,
``text`` or ``http`` show rather than do (trees, diagrams, the wire format) and need no
marker; a marker on one is checked all the same.
"""

import ast
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from markdown_it import MarkdownIt

from helpers.doc_blocks import (
    ROOT,
    Block,
    Marker,
    all_blocks,
    doc_paths,
    parse_blocks,
    run_shell,
    shell_script,
    venv_environment,
)
from spark_checkpoint.storage import CheckpointMetadata
from spark_checkpoint_operator.manifest.loading import manifest_from_document

KUBERNETES_VERSION = "1.30"
TIMEOUT_SECONDS = 120

# Languages a reader runs or applies, by the name the harness knows them under.
RUNNABLE = {
    "sh": "shell",
    "shell": "shell",
    "bash": "shell",
    "console": "console",
    "python": "python",
    "py": "python",
    "yaml": "yaml",
    "yml": "yaml",
    "json": "json",
    "dockerfile": "dockerfile",
}
# Blocks that show something rather than do it: trees, diagrams, wire-format examples.
DESCRIPTIVE = {"", "text", "http"}

# Programs whose commands act outside this machine; a block using them is never run here.
OUTSIDE_PROGRAMS = {
    "kubectl",
    "helm",
    "spark-checkpoint-operator",
    "docker",
    "podman",
    "argocd",
    "flux",
    "kopf",
}
# Words before a command that run it: a program after them is still the command's.
_WRAPPERS = {"sudo", "env", "time", "exec", "command", "nohup", "xargs"}
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")
_ANY_MARKER = re.compile(r"<!--\s*(illustrative|tested-by)\s*:")
_TESTED_BY = re.compile(r"(tests/[\w/]+\.py)::(\w+)(\[[^\]]*\])?")


def _checked() -> list[Block]:
    return [b for b in all_blocks() if b.language not in DESCRIPTIVE or b.marker]


@pytest.mark.parametrize("block", _checked(), ids=str)
def test_block_runs_or_is_marked(block: Block, tmp_path: Path) -> None:
    _check_block(block, tmp_path)


def _check_block(block: Block, tmp_path: Path) -> None:
    if block.marker is None:
        if block.language in DESCRIPTIVE:
            return
        language = RUNNABLE.get(block.language.lower())
        assert language, (
            f"{block}: unknown language {block.language!r}; use one of {sorted(RUNNABLE)} "
            f"or, for a block that is not run, one of {sorted(DESCRIPTIVE - {''})} or none"
        )
        _run(block, language, tmp_path)
    elif block.marker.kind == "illustrative":
        assert block.marker.value, f"{block}: <!-- illustrative: ... --> needs its reason"
    else:
        _check_tested_by(block)


def _run(block: Block, language: str, tmp_path: Path) -> None:
    if language == "python":
        _run_python(block, tmp_path)
    elif language in ("shell", "console"):
        _run_shell(block, tmp_path)
    elif language == "yaml":
        _apply_yaml(block)
    elif language == "json" and '"format_version"' in block.text:
        CheckpointMetadata.from_bytes(block.text.encode(), str(block))
    else:
        pytest.fail(
            f"{block}: a {language} block is not run by the harness: have a test read it "
            "(<!-- tested-by: tests/<file>.py::<test> -->) or say why it cannot be "
            "(<!-- illustrative: <reason> -->) on the line above the fence"
        )


def _run_python(block: Block, tmp_path: Path) -> None:
    (tmp_path / "snippet.py").write_text(block.text)
    result = subprocess.run(
        [sys.executable, "snippet.py"],
        cwd=tmp_path,
        env=venv_environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )
    assert result.returncode == 0, (
        f"{block} exits {result.returncode}:\n{block.text}\n"
        f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )


def _run_shell(block: Block, tmp_path: Path) -> None:
    # Never from a test: with a KUBECONFIG or a Docker engine at hand they would change a
    # real cluster or registry.
    outside = sorted(_programs(shell_script(block)) & OUTSIDE_PROGRAMS)
    assert not outside, (
        f"{block}: {', '.join(outside)} act on a cluster, image or registry and are not run "
        "here: mark the block tested-by tests/docs/test_cluster_commands.py::"
        "test_cluster_commands_refer_to_what_the_project_ships (helm, kubectl, "
        "spark-checkpoint-operator) or "
        "illustrative, with the reason"
    )
    for directory in ("examples", "crds"):
        shutil.copytree(ROOT / directory, tmp_path / directory, ignore=_ignore_data)
    run_shell(block, tmp_path, timeout=TIMEOUT_SECONDS)


def _programs(script: str) -> set[str]:
    """The programs a shell script runs: each command's first word after a line break, an
    operator (``&&``, ``|``, ``;``) or an opening ``$(``, past variable assignments and
    wrappers such as ``sudo`` and ``env``, without its directory."""
    programs = set()
    for line in re.sub(r"\\\n", " ", script).splitlines():
        lexer = shlex.shlex(line.replace("`", " ; "), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        starting, redirected = True, False
        for token in lexer:
            if set(token) <= set("<>"):
                redirected = True  # the next word is a file
            elif set(token) <= set("();|&"):
                starting = True
            elif redirected:
                redirected = False
            elif starting and not (_ASSIGNMENT.match(token) or token in _WRAPPERS):
                programs.add(token.rsplit("/", 1)[-1])
                starting = False
    return programs


def _ignore_data(directory: str, names: list[str]) -> list[str]:
    # What runs and tests leave behind in the checkout is not part of the docs' world.
    return [n for n in names if n in ("data", "__pycache__", ".spark-checkpoint")]


def _apply_yaml(block: Block) -> None:
    documents = [d for d in yaml.safe_load_all(block.text) if d is not None]
    assert documents, f"{block}: an empty YAML block"
    for document in documents:
        if not (isinstance(document, dict) and "apiVersion" in document and "kind" in document):
            pytest.fail(
                f"{block}: not a Kubernetes object (no apiVersion and kind), so nothing can "
                "check it: mark it tested-by or illustrative"
            )
        if document["kind"] == "SparkCheckpointJob":
            manifest_from_document(document, str(block))
        else:
            try:
                kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{block}: {error.message} at {list(error.path)}")


def _check_tested_by(block: Block) -> None:
    assert block.marker is not None
    test_id = block.marker.value
    match = _TESTED_BY.fullmatch(test_id)
    assert match, f"{block}: tested-by wants tests/<path>.py::<test_name>, not {test_id!r}"
    path, name = ROOT / match[1], match[2]
    assert path.is_file(), f"{block}: tested-by names {match[1]}, which does not exist"
    function = next(
        (
            node
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name
        ),
        None,
    )
    assert function, f"{block}: tested-by names {name}, which {match[1]} does not define"
    own_id = f"{match[1]}::{name}"
    reads_its_blocks = any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "marked_blocks"
        and [ast.literal_eval(a) for a in node.args if isinstance(a, ast.Constant)] == [own_id]
        for node in ast.walk(function)
    )
    assert reads_its_blocks, (
        f"{block}: {own_id} does not read the blocks marked for it "
        f'(marked_blocks("{own_id}")), so the doc could drift from what it tests'
    )
    module_marks = [
        node.value
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
    ]
    marks = {
        node.attr
        for mark in [*function.decorator_list, *module_marks]
        for node in ast.walk(mark)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
    }
    # Those skip without a cluster: a block tested only there is not tested by CI.
    assert "cluster" not in marks, (
        f"{block}: {own_id} is marked cluster: CI does not run it, so nothing in CI tests the block"
    )


def test_the_docs_are_found() -> None:
    docs = {b.doc for b in all_blocks()}
    assert {"README.md", "docs/user-guide.md", "benchmarks/README.md"} <= docs


def test_a_marker_must_sit_directly_above_a_fence() -> None:
    """A marker separated from its fence (a blank line, moved text) would silently stop
    applying; every marker in the docs must be claimed by the block below it."""
    stray = [
        f"{doc}:{line}"
        for doc in doc_paths()
        for line in _stray_markers((ROOT / doc).read_text(encoding="utf-8"))
    ]
    assert stray == [], f"markers not directly above a code fence: {stray}"


def _stray_markers(source: str) -> list[int]:
    """Lines of marker comments (HTML, not text in code) that no fence claims."""
    claimed = {b.line - 1 for b in parse_blocks("", source) if b.marker is not None}
    comments = []
    for token in MarkdownIt("commonmark").parse(source):
        if (token.type == "html_block" and _ANY_MARKER.search(token.content)) or (
            token.type == "inline"
            and any(
                child.type == "html_inline" and _ANY_MARKER.search(child.content)
                for child in token.children or []
            )
        ):
            comments.append(token.map[0] + 1 if token.map else 0)
    return [line for line in comments if line not in claimed]


def test_json_blocks_parse() -> None:
    """Whatever else covers them, every JSON block is JSON."""
    for block in all_blocks():
        if block.language == "json":
            try:
                json.loads(block.text)
            except json.JSONDecodeError as error:
                pytest.fail(f"{block}: not JSON: {error}")


# --- the harness itself: each check fails on what it exists to catch ----------------------


def _block(language: str, text: str, marker: Marker | None = None) -> Block:
    return Block(doc="docs/example.md", line=3, language=language, text=text, marker=marker)


@pytest.mark.parametrize(
    ("block", "complaint"),
    [
        (_block("python", "import sys\nsys.exit('no')\n"), "exits 1"),
        (_block("sh", "spark-checkpoint list --nope\n"), "exits 2"),
        (_block("yaml", "resource: {a: 1}\n"), "not a Kubernetes object"),
        (
            _block(
                "yaml",
                "apiVersion: sparkcheckpoint.io/v1alpha1\nkind: SparkCheckpointJob\n"
                "metadata: {name: a}\nspec:\n  application: {mainFile: a.py}\n"
                "  checkpointing: {interval: 5s, minPause: 10s}\n",
            ),
            "minPause",
        ),
        (
            _block(
                "yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndatta: {}\n",
            ),
            "datta",
        ),
        (_block("json", '{"id": 7}\n'), "not run by the harness"),
        (_block("dockerfile", "FROM scratch\n"), "not run by the harness"),
        (_block("pyhton", "print(1)\n"), "unknown language"),
        (_block("sh", "ls\nkubectl apply -f examples/wordcount/job.yaml\n"), "kubectl act on"),
        (_block("sh", "true && helm install a charts/spark-checkpoint-operator\n"), "helm act"),
        (_block("console", "$ docker build .\nStep 1/9\n"), "docker act"),
        (_block("sh", "KUBECONFIG=x kubectl get pods\n"), "kubectl act"),
        (_block("sh", "sudo /usr/local/bin/helm list\n"), "helm act"),
        (_block("sh", "echo $(kubectl get pods -o name)\n"), "kubectl act"),
        (_block("sh", "ls;kopf run -m handlers\n"), "kopf act"),
        (_block("sh", "make demo\n", Marker("illustrative", "")), "needs its reason"),
        (
            _block("sh", "true\n", Marker("tested-by", "tests/docs/test_nothing.py::test_x")),
            "does not exist",
        ),
        (
            _block(
                "sh", "true\n", Marker("tested-by", "tests/docs/test_docs_run.py::test_nothing")
            ),
            "does not define",
        ),
        (
            _block(
                "sh",
                "true\n",
                Marker("tested-by", "tests/docs/test_docs_run.py::test_the_docs_are_found"),
            ),
            "does not read the blocks marked for it",
        ),
        (_block("sh", "true\n", Marker("tested-by", "test_the_docs_are_found")), "wants tests/"),
    ],
    ids=lambda value: value.language if isinstance(value, Block) else "",
)
def test_the_harness_rejects(block: Block, complaint: str, tmp_path: Path) -> None:
    with pytest.raises((AssertionError, pytest.fail.Exception, ValueError)) as raised:
        _check_block(block, tmp_path)
    assert complaint in str(raised.value)
    assert str(block) in str(raised.value), "the complaint names the doc and line"


@pytest.mark.parametrize(
    "block",
    [
        _block("python", "from spark_checkpoint.storage import JobStorageLayout\n"),
        _block("sh", "spark-checkpoint --help\ntest -f examples/wordcount/job.yaml\n"),
        _block("console", "$ spark-checkpoint --help\nusage: spark-checkpoint ...\n"),
        _block("http", "GET /v1/status\n"),
        _block("json", "{}", Marker("illustrative", "an empty answer")),
    ],
    ids=lambda block: block.language,
)
def test_the_harness_accepts(block: Block, tmp_path: Path) -> None:
    _check_block(block, tmp_path)


def test_a_marker_apart_from_its_fence_is_stray() -> None:
    source = (
        "<!-- illustrative: a -->\n```sh\nmake\n```\n\n"
        "<!-- illustrative: b -->\n\n```sh\nmake\n```\n"
        "- item\n\n  <!-- tested-by: tests/x.py::test_y -->\n  ```json\n  {}\n  ```\n\n"
        "Text `<!-- illustrative: in code -->` and <!-- illustrative: inline -->.\n"
        "`<!-- illustrative: code above a fence -->`\n```sh\nmake\n```\n"
    )
    assert _stray_markers(source) == [6, 18]
    blocks = parse_blocks("doc.md", source)
    assert [b.marker for b in blocks] == [
        Marker("illustrative", "a"),
        None,
        Marker("tested-by", "tests/x.py::test_y"),
        None,
    ]
