"""Pod templates (spec.podTemplate, spec.driver.podTemplate, spec.executor.podTemplate):
core/v1 PodTemplateSpecs the job's pods are built over, as the Flink Kubernetes Operator's
podTemplate fields. One rule merges a role's template over the common one, and the
operator's own pod over the result."""

import copy
from collections.abc import Mapping
from typing import Any

# A template's container of this name is the pod's own (the driver's, each executor's, a
# cleanup or check pod's), whatever the operator or Spark names it; any other is added
# beside it (a sidecar).
MAIN_CONTAINER = "spark-main-container"
# Lists whose items are merged by name; any other list of objects adds up.
_MERGED_BY_NAME = frozenset({"containers", "initContainers"})


def merged(base: Any, over: Any, key: str = "") -> Any:
    """``over`` over ``base``: objects merge key by key; ``containers`` and
    ``initContainers`` item by item of the same name (``base``'s order, then ``over``'s
    new ones); any other list of objects adds up (``base``'s items, then those of ``over``
    it lacks: tolerations, volumes, mounts, env); anything else is ``over``'s. Neither is
    changed."""
    if isinstance(base, Mapping) and isinstance(over, Mapping):
        result = {name: copy.deepcopy(value) for name, value in base.items()}
        for name, value in over.items():
            result[name] = merged(base[name], value, name) if name in base else copy.deepcopy(value)
        return result
    if isinstance(base, list) and isinstance(over, list) and _all_objects(base + over):
        if key in _MERGED_BY_NAME:
            overs = {item.get("name"): item for item in over}
            names = {item.get("name") for item in base}
            return [
                merged(item, overs[item.get("name")])
                if item.get("name") in overs
                else copy.deepcopy(item)
                for item in base
            ] + [copy.deepcopy(item) for item in over if item.get("name") not in names]
        return copy.deepcopy(base) + [copy.deepcopy(item) for item in over if item not in base]
    return copy.deepcopy(over)


def _all_objects(items: list[Any]) -> bool:
    return all(isinstance(item, Mapping) for item in items)
