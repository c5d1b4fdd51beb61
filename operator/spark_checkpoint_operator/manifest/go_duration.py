"""Durations as Go reads them (`time.ParseDuration`), which is how the API server's CEL rules
compare the CRD's duration fields: one definition for those rules and for the manifest's
model."""

import re

INT64_MAX = 2**63 - 1
_TERM = re.compile(r"([0-9]+)(?:\.([0-9]+))?(ns|us|ms|s|m|h)")
_TERMS = re.compile(rf"(?:{_TERM.pattern})+")
_NANOSECONDS = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}


def nanoseconds(duration: str) -> int:
    """`duration` (terms such as 1h, 1.5s, 300ms: the CRD's pattern) in whole nanoseconds,
    as Go computes them: 1.4s and 1400ms are one duration, 0.5ns is 0s. Raises ValueError
    for another form; a sum beyond int64's range (which Go refuses) is returned as it is."""
    if not _TERMS.fullmatch(duration):
        raise ValueError(f"not a duration: {duration!r}")
    return sum(_term(*term) for term in _TERM.findall(duration))


def _term(whole: str, fraction: str, unit: str) -> int:
    """One term as Go computes it: the fraction's digits as an integer (those past int64's
    range ignored) scaled in float64, truncated to a nanosecond."""
    digits, scale = 0, 1.0
    for digit in fraction:
        if digits > INT64_MAX // 10 or digits * 10 + int(digit) > 2**63:
            break
        digits, scale = digits * 10 + int(digit), scale * 10
    return int(whole) * _NANOSECONDS[unit] + int(digits * (_NANOSECONDS[unit] / scale))
