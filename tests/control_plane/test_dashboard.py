"""The Grafana dashboard queries only metrics the operator exports."""

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from spark_checkpoint_operator.coordinator import CheckpointKind, CompletedCheckpoint
from spark_checkpoint_operator.metrics import CheckpointMetrics
from spark_checkpoint_operator.supervisor import PeriodicSlot

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "docs" / "grafana" / "spark-checkpoint-operator.json"
)


# Labels Prometheus sets on every series it scrapes (the target's: `job`, `instance`; and
# the Prometheus Operator's, from its ServiceMonitor): a metric's own label of such a name is
# renamed `exported_<name>`, and the dashboard's selectors on it would find nothing.
TARGET_LABELS = {"job", "instance", "namespace", "service", "pod", "container", "endpoint"}


def _labels() -> set[str]:
    """The label names of every series, each metric given a sample."""
    registry = CollectorRegistry()
    job = CheckpointMetrics(registry).job("default", "orders")
    job.completed(CompletedCheckpoint(1, CheckpointKind.CHECKPOINT, 1, "/1", 1, 0.0, 1.0))
    job.periodic(PeriodicSlot(due=1.0, decided=1.5, next_due=2.0, checkpoint_id=1))
    job.restored()
    return {name for family in registry.collect() for s in family.samples for name in s.labels}


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


def test_no_metric_label_is_one_prometheus_sets_on_its_targets() -> None:
    assert _labels(), "the metrics have labels"
    assert not _labels() & TARGET_LABELS


def test_every_label_a_query_selects_or_groups_by_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    legends = [t.get("legendFormat", "") for p in dashboard["panels"] for t in p["targets"]]

    used = {
        *(name for e in expressions for name in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", e)),
        *(
            name.strip()
            for e in expressions
            for group in re.findall(r"by \(([^)]*)\)", e)
            for name in group.split(",")
        ),
        *(name for e in expressions for name in re.findall(r"label_values\(.*, (\w+)\)", e)),
        *(name for legend in legends for name in re.findall(r"\{\{(\w+)\}\}", legend)),
    }

    assert used <= _labels() | {"le"}, used - _labels()
