"""The jax device for the session, and the OpInfo reports of the eager and compile ways.

T2J_OPINFO_EAGER_REPORT / T2J_OPINFO_COMPILE_REPORT name the files; each has the export report's format
(tests/ops/conftest.py, whose merge and write it uses), so scripts/gen_ops_doc.py reads all three.
"""

from __future__ import annotations

import os

import pytest

import torch2jax.eager as te
from tests.models.conftest import pytest_collection_modifyitems  # noqa: F401 - a plain run leaves out the slow tier
from tests.ops.conftest import _case, _load, _write, failure_reason, merge_report

_OUTCOMES: dict[str, str] = {}
_REASONS: dict[str, str] = {}
_SAMPLES: dict[str, dict] = {}
_STATE: dict = {"kept": {}, "writer": False}
_COMPILE_RUN: dict[str, dict] = {"outcomes": {}, "samples": {}, "reasons": {}}


def pytest_configure(config):
    """The jax device is registered when this conftest loads, at collection, before any test of the session
    runs a backward pass: torch's autograd engine sets up its devices at the first one, in each process.

    Only the process that sees every result writes the reports (the xdist controller, or pytest without
    xdist); cases an eager run does not cover keep their recorded outcome (a run over some ops updates those)."""
    te.enable()
    writer = not hasattr(config, "workerinput")
    _STATE["writer"] = writer
    path = os.environ.get("T2J_OPINFO_EAGER_REPORT")
    if path and writer:
        _STATE["kept"] = _load(path)


def pytest_runtest_logreport(report):
    if not _STATE["writer"] or not (report.when == "call" or (report.when == "setup" and report.outcome != "passed")):
        return
    quota = os.environ.get("T2J_OPINFO_SAMPLES", "1")
    eager_path, compile_path = os.environ.get("T2J_OPINFO_EAGER_REPORT"), os.environ.get("T2J_OPINFO_COMPILE_REPORT")
    if eager_path and "test_opinfo_eager[" in report.nodeid:
        case = _case(report.nodeid)
        _OUTCOMES[case] = report.outcome
        _SAMPLES.update(_samples(case, report))
        if report.failed:
            _REASONS[case] = failure_reason(report.longreprtext)
        _write(eager_path, merge_report(_STATE["kept"], _OUTCOMES, _SAMPLES, _REASONS, quota))
    elif compile_path and "test_opinfo_compile[" in report.nodeid:
        case = _case(report.nodeid)
        outcome = report.outcome
        if outcome == "skipped" and "torch.compile cannot capture" in str(report.longrepr):
            outcome = "torch-limit"
        elif outcome == "skipped" and "refused by design" in str(report.longrepr):
            outcome = "refused"
        run = _COMPILE_RUN
        run["outcomes"][case] = outcome
        run["samples"].update(_samples(case, report))
        if report.failed:
            run["reasons"][case] = failure_reason(report.longreprtext)
        _write(compile_path, merge_report({}, run["outcomes"], run["samples"], run["reasons"], quota))


def _samples(case: str, report) -> dict:
    """The case's sample counts, as the test recorded them (record_property("samples", ...))."""
    recorded = [value for name, value in report.user_properties if name == "samples"]
    return {case: recorded[-1]} if recorded else {}


@pytest.fixture
def fresh_dynamo():
    """Each torch.compile test starts and ends with dynamo's caches and counters empty."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
