"""Record each OpInfo case's outcome when T2J_OPINFO_REPORT names a file (make test-ops-full).

The report is rewritten after every case, so a sweep that is stopped keeps what it did:
T2J_OPINFO_RESUME=1 keeps the report's cases and skips those already run with the same sample quota;
T2J_OPINFO_MERGE=1 keeps the report's cases that this run does not cover (a sweep one dtype at a time).
"""

from __future__ import annotations

import json
import os
from collections import Counter

_OUTCOMES: dict[str, str] = {}
_REASONS: dict[str, str] = {}
_SAMPLES: dict[str, dict[str, int]] = {}  # case -> sample outcome -> count
_STATE: dict = {"kept": {}, "writer": False}


def _report_path() -> str | None:
    return os.environ.get("T2J_OPINFO_REPORT")


def _quota() -> str:
    return os.environ.get("T2J_OPINFO_SAMPLES", "1")


def pytest_configure(config):
    # Only the process that sees every result writes: the xdist controller, or pytest without xdist.
    _STATE["writer"] = bool(_report_path()) and not hasattr(config, "workerinput")
    if _STATE["writer"] and (os.environ.get("T2J_OPINFO_MERGE") or os.environ.get("T2J_OPINFO_RESUME")):
        _STATE["kept"] = _load(_report_path())


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("T2J_OPINFO_RESUME") or not _report_path():
        return
    report = _load(_report_path())
    quotas = _case_quotas(report)
    done = {case for case in report.get("cases", {}) if quotas.get(case) == _quota()}
    skip = [item for item in items if "test_opinfo[" in item.nodeid and _case(item.nodeid) in done]
    if skip:
        config.hook.pytest_deselected(items=skip)
        items[:] = [item for item in items if item not in skip]


def pytest_runtest_logreport(report):
    if "test_opinfo[" not in report.nodeid:
        return
    case = _case(report.nodeid)
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
        if _STATE["writer"]:
            _write(_report_path(), merge_report(_STATE["kept"], _OUTCOMES, _SAMPLES, _REASONS, _quota()))


def merge_report(kept: dict, outcomes: dict, samples: dict, reasons: dict, quota: str) -> dict:
    """This run's cases over `kept`'s. Per-sample counts are summed per dtype from each case's; an older
    report has only the sums, so its dtype is replaced whole once this run covers any case of it."""
    legacy = kept and "case_samples" not in kept
    new_dtypes = {_dtype(case) for case in outcomes}

    def merged(old: dict, new: dict) -> dict:
        carried = {case: value for case, value in old.items()
                   if case not in outcomes and not (legacy and _dtype(case) in new_dtypes)}
        return dict(sorted({**carried, **new}.items()))

    cases = merged(kept.get("cases", {}), outcomes)
    case_samples = merged(kept.get("case_samples", {}), samples)
    case_quota = merged(_case_quotas(kept), {case: quota for case in outcomes})
    by_dtype: dict[str, Counter] = {}
    samples_by_dtype: dict[str, Counter] = {}
    quotas: dict[str, set] = {}
    for case, outcome in cases.items():
        dtype = _dtype(case)
        by_dtype.setdefault(dtype, Counter())[outcome] += 1
        samples_by_dtype.setdefault(dtype, Counter()).update(case_samples.get(case, {}))
        quotas.setdefault(dtype, set()).add(case_quota[case])
    if legacy:
        for dtype, counts in kept.get("samples_by_dtype", {}).items():
            if dtype not in new_dtypes:
                samples_by_dtype[dtype] = Counter(counts)
    return {
        "samples_per_op": {dtype: ", ".join(sorted(q)) for dtype, q in sorted(quotas.items())},
        "dtypes": sorted(by_dtype),
        "by_dtype": {d: dict(c) for d, c in sorted(by_dtype.items())},
        "samples_by_dtype": {d: dict(c) for d, c in sorted(samples_by_dtype.items())},
        "cases": cases,
        "case_samples": case_samples,
        "case_quota": case_quota,
        "failures": merged(kept.get("failures", {}), reasons),
    }


def _case(nodeid: str) -> str:
    return nodeid.split("[", 1)[1].rstrip("]")


def _dtype(case: str) -> str:
    return case.rsplit("-", 1)[1]


def _case_quotas(report: dict) -> dict[str, str]:
    """Samples per case ("0" = every sample); older reports kept one number for all cases."""
    if "case_quota" in report:
        return report["case_quota"]
    quota = report.get("samples_per_op", "1")
    return {case: str(quota) for case in report.get("cases", {})}


def _load(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _write(path: str, data: dict) -> None:
    """Write then rename: a sweep stopped mid-write leaves the previous report, not half of one."""
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)


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
