"""The demo behind `make demo`: a coordinated run that shows checkpoints, a restore after
the driver is killed, and a final checkpoint, then checks the output against ground truth.

    python examples/wordcount/demo.py [--files 48] [--kill-after-checkpoints 2]

It fails unless the driver was killed and restored before the input ran out: a demo that
quietly skipped its restore would show less than it says.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from generate_input import generate
from ground_truth import expected_counts

from spark_checkpoint.sink import latest_values

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # One file per batch: enough batches after the kill for the restored driver to work on.
    parser.add_argument("--files", type=int, default=48)
    parser.add_argument("--kill-after-checkpoints", type=int, default=2)
    args = parser.parse_args()

    data, state = HERE / "data", HERE / "data" / "state"
    shutil.rmtree(data, ignore_errors=True)
    generate(data / "input", files=args.files, lines=300, seed=1, start_index=0)
    print(f"demo: wrote {args.files} input files to {data / 'input'}", flush=True)

    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spark_checkpoint_operator.cli",
            "run",
            str(HERE / "job.yaml"),
            "--state-dir",
            str(state),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert run.stdout is not None
    completed, killed = 0, False
    for line in run.stdout:
        print(line, end="", flush=True)
        if "checkpoint" in line and " complete:" in line:
            completed += 1
            if completed == args.kill_after_checkpoints and not killed:
                killed = True
                _kill_driver(state / "default" / "wordcount" / "status.json")
    if run.wait() != 0:
        print(f"demo: the run failed (exit {run.returncode})")
        return 1
    status = json.loads((state / "default" / "wordcount" / "status.json").read_text())
    restores = status["status"]["counts"]["restored"]
    if not killed or restores < 1:
        print(
            f"demo: the input ran out after {completed} checkpoints, before the driver was "
            f"killed and restored (restores: {restores}); run it with more --files"
        )
        return 1

    expected = expected_counts(data / "input")
    actual = {
        word: int(row["count"]) for word, row in latest_values(data / "output", "word").items()
    }
    if actual != expected:
        wrong = {w for w in expected.keys() | actual.keys() if expected.get(w) != actual.get(w)}
        print(f"demo: output differs from ground truth for {len(wrong)} words")
        return 1
    print(
        f"demo: exactly-once output verified: {len(expected)} words, {sum(expected.values())} rows"
    )
    # A run of the job on its own afterwards starts without a checkpoint: the sink refuses
    # output an earlier run committed to.
    shutil.rmtree(data / "output")
    shutil.rmtree(state)
    print(
        "demo: removed its output and state, kept the input: "
        f"`{Path(sys.executable).parent / 'spark-checkpoint'} run {HERE / 'job.yaml'}` runs "
        "the job on it from the start"
    )
    return 0


def _kill_driver(status_file: Path) -> None:
    pid = json.loads(status_file.read_text())["driver"]["pid"]
    print(
        f"demo: killing the driver (kill -9 of process group {pid}) to show a restore", flush=True
    )
    os.killpg(pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
