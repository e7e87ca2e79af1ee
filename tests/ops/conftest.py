"""Record each OpInfo case's outcome when T2J_OPINFO_REPORT names a file (make test-ops-full)."""

from __future__ import annotations

import json
import os
from collections import Counter

_OUTCOMES: dict[str, str] = {}
_REASONS: dict[str, str] = {}
_SAMPLES: dict[str, dict[str, int]] = {}  # case -> sample outcome -> count


def pytest_runtest_logreport(report):
    if "test_opinfo[" not in report.nodeid:
        return
    case = report.nodeid.split("[", 1)[1].rstrip("]")
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome
        if outcome == "skipped" and "torch.export cannot export" in str(report.longrepr):
            outcome = "torch-limit"
        elif outcome == "skipped" and "refused by design" in str(report.longrepr):
            outcome = "refused"
        _OUTCOMES[case] = outcome
        for name, value in report.user_properties:
            if name == "samples":
                _SAMPLES[case] = value
        if report.failed:
            _REASONS[case] = failure_reason(report.longreprtext)


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("T2J_OPINFO_REPORT")
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller sees every report and writes the file
    if not path or not _OUTCOMES:
        return
    by_dtype: dict[str, Counter] = {}
    for case, outcome in _OUTCOMES.items():
        dtype = case.rsplit("-", 1)[1]
        by_dtype.setdefault(dtype, Counter())[outcome] += 1
    samples_by_dtype: dict[str, Counter] = {}
    for case, counts in _SAMPLES.items():
        samples_by_dtype.setdefault(case.rsplit("-", 1)[1], Counter()).update(counts)
    data = {
        "samples_per_op": os.environ.get("T2J_OPINFO_SAMPLES", "1"),
        "dtypes": os.environ.get("T2J_OPINFO_DTYPES", "rotate"),
        "by_dtype": {d: dict(c) for d, c in sorted(by_dtype.items())},
        "samples_by_dtype": {d: dict(c) for d, c in sorted(samples_by_dtype.items())},
        "cases": dict(sorted(_OUTCOMES.items())),
        "case_samples": dict(sorted(_SAMPLES.items())),
        "failures": dict(sorted(_REASONS.items())),
    }
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def failure_reason(text: str) -> str:
    """One line saying why a case failed: the ops without a lowering, or the first error line."""
    lines = [line.strip().removeprefix("E").strip() for line in text.splitlines()]
    missing = sorted({line[2:].split(" ")[0] for line in lines if line.startswith("- ") and "(node " in line})
    if "UnsupportedOpsError" in text and missing:
        return "no lowering for " + ", ".join(missing)
    summary = [line for line in lines if "samples failed; sample" in line]
    if summary:
        return summary[-1].removeprefix("AssertionError:").strip()[:200]
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("E ") and ("Error" in stripped or "not close" in stripped or "Mismatch" in stripped):
            return stripped[1:].strip()[:160]
    return text.strip().splitlines()[-1][:160] if text.strip() else "failed"
