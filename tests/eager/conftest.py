"""Record each compile-way OpInfo case's outcome when T2J_OPINFO_COMPILE_REPORT names a file, in the
export way's report format (tests/ops/conftest.py), so docs/ops.md can show a column per way."""

from __future__ import annotations

import os

from ..models.conftest import pytest_collection_modifyitems  # noqa: F401 - a plain run leaves out the slow tier
from ..ops.conftest import _case, failure_reason, merge_report
from ..ops.conftest import _write as write_report

_RUN: dict[str, dict] = {"outcomes": {}, "samples": {}, "reasons": {}}
_WRITER = {"on": False}


def pytest_configure(config):
    # Only the process that sees every result writes: the xdist controller, or pytest without xdist.
    _WRITER["on"] = not hasattr(config, "workerinput")


def pytest_runtest_logreport(report):
    path = os.environ.get("T2J_OPINFO_COMPILE_REPORT")
    if not path or not _WRITER["on"] or "test_opinfo_compile[" not in report.nodeid:
        return
    if not (report.when == "call" or (report.when == "setup" and report.outcome != "passed")):
        return
    case = _case(report.nodeid)
    outcome = report.outcome
    if outcome == "skipped" and "torch.compile cannot capture" in str(report.longrepr):
        outcome = "torch-limit"
    elif outcome == "skipped" and "refused by design" in str(report.longrepr):
        outcome = "refused"
    _RUN["outcomes"][case] = outcome
    for name, value in report.user_properties:
        if name == "samples":
            _RUN["samples"][case] = value
    if report.failed:
        _RUN["reasons"][case] = failure_reason(report.longreprtext)
    quota = os.environ.get("T2J_OPINFO_SAMPLES", "1")
    write_report(path, merge_report({}, _RUN["outcomes"], _RUN["samples"], _RUN["reasons"], quota))
