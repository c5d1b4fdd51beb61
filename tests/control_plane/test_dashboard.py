"""The Grafana dashboard queries only metrics the operator exports."""

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from spark_checkpoint_operator.metrics import CheckpointMetrics

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "docs" / "grafana" / "spark-checkpoint-operator.json"
)


def _exported() -> set[str]:
    registry = CollectorRegistry()
    CheckpointMetrics(registry)
    names = set()
    for family in registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
        names.update(family.name + s for s in suffixes.get(family.type, [""]))
    return names


def test_every_query_names_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]

    used = {name for e in expressions for name in re.findall(r"spark_checkpoint_\w+", e)}

    assert used, "the dashboard queries something"
    assert used <= _exported(), used - _exported()
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
