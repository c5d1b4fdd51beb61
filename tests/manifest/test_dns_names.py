"""Every place that checks a Kubernetes name agrees with Kubernetes' rule on hostile names:
the storage layout (namespace and job become paths), a manifest's metadata, and the CRD's
own name fields (checked as the API server checks them).

The oracle is Kubernetes' rule written out without a regular expression
(k8s.io/apimachinery/pkg/util/validation IsDNS1123Label and IsDNS1123Subdomain): ASCII
lowercase letters, digits and '-', starting and ending with a letter or digit; a label is
at most 63 characters, a subdomain is dot-separated labels of at most 253 in all.
"""

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_checkpoint.storage.layout import require_dns_1123_label, require_dns_1123_subdomain
from spark_checkpoint_operator.manifest.loading import manifest_from_document
from spark_checkpoint_operator.manifest.problems import ManifestError

MINIMAL = Path(__file__).parent / "fixtures" / "minimal-job.yaml"
_LABEL_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


def kubernetes_label(name: str, max_length: int = 63) -> bool:
    return (
        0 < len(name) <= max_length
        and set(name) <= _LABEL_CHARACTERS
        and name[0] != "-"
        and name[-1] != "-"
    )


def kubernetes_subdomain(name: str) -> bool:
    # Each part is a label whose own length is bounded only by the whole name's.
    return len(name) <= 253 and all(kubernetes_label(part, 253) for part in name.split("."))


# Letters and digits outside ASCII that a careless pattern takes for [a-z0-9] (the Kelvin
# sign lowercases to 'k', Arabic-Indic zero is a digit to \d), case, separators and
# whitespace, and a newline where Python's `$` still matches.
_HOSTILE = [
    "a",
    "z",
    "0",
    "9",
    "-",
    ".",
    "A",
    "Z",
    "_",
    " ",
    "\n",
    "é",
    "\u212a",
    "\u0660",
    "\u0131",
]
HOSTILE_NAMES = [
    "a",
    "a" * 63,
    "a" * 64,
    "a" * 253,
    "a" * 254,
    ".".join(["a" * 63] * 4)[:253],  # 253 characters of full-length labels
    "a" * 64 + ".b",  # a label longer than 63 inside a subdomain
    "-a",
    "a-",
    "a--b",
    ".a",
    "a.",
    "a..b",
    "a.-b",
    "a-.b",
    "A",
    "aB",
    "a_b",
    "a b",
    "a\n",
    "\na",
    "é",
    "\u212a",
    "\u0660",
    "",
]

names = st.one_of(
    st.sampled_from(HOSTILE_NAMES),
    st.lists(st.sampled_from(_HOSTILE), min_size=1, max_size=12).map("".join),
    # Around the length limits: a run of one character, with a hostile one inside.
    st.builds(
        lambda length, index, char: ("a" * length)[:index] + char + ("a" * length)[index + 1 :],
        st.sampled_from([62, 63, 64, 252, 253, 254]),
        st.integers(0, 254),
        st.sampled_from(_HOSTILE),
    ),
)


def _accepted_by_layout(check: Any, name: str) -> bool:
    try:
        check(name, "field")
    except ValueError:
        return False
    return True


def _accepted_by_manifest(section: str, field: str, name: str) -> bool:
    """Whether a minimal manifest with ``name`` in ``section`` (metadata or a part of the
    spec) is accepted."""
    document: dict[str, Any] = yaml.safe_load(MINIMAL.read_text())
    parent = document["metadata"] if section == "metadata" else document["spec"]
    if section != "metadata":
        parent = parent.setdefault(section, {})
    parent[field] = name
    try:
        manifest_from_document(document, "job.yaml")
    except ManifestError:
        return False
    return True


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=repr)
def test_the_oracle_reads_the_examples_as_kubernetes_does(name: str) -> None:
    accepted_labels = {"a", "a" * 63, "a--b"}
    accepted_subdomains = accepted_labels | {"a" * 64, "a" * 253, "a" * 64 + ".b"}
    accepted_subdomains.add(".".join(["a" * 63] * 4)[:253])
    assert kubernetes_label(name) == (name in accepted_labels)
    assert kubernetes_subdomain(name) == (name in accepted_subdomains)


@given(names)
def test_the_storage_layout_checks_names_as_kubernetes_does(name: str) -> None:
    assert _accepted_by_layout(require_dns_1123_label, name) == kubernetes_label(name)
    assert _accepted_by_layout(require_dns_1123_subdomain, name) == kubernetes_subdomain(name)


@settings(max_examples=150, deadline=None)  # four manifests validated per name
@given(names)
def test_a_manifest_s_names_are_checked_as_kubernetes_checks_them(name: str) -> None:
    # The CRD bounds a job's name further: it is also a label value on the job's pods.
    job_name = kubernetes_subdomain(name) and len(name) <= 63
    assert _accepted_by_manifest("metadata", "name", name) == job_name
    assert _accepted_by_manifest("metadata", "namespace", name) == kubernetes_label(name)
    # The CRD's own name fields, with its spelling of the pattern.
    assert _accepted_by_manifest("driver", "serviceAccount", name) == kubernetes_subdomain(name)
    claim = _accepted_by_manifest("checkpointing", "liveVolumeClaim", name)
    assert claim == kubernetes_subdomain(name)
