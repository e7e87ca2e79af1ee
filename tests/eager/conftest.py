"""The jax device for the session, and the eager OpInfo report (T2J_OPINFO_EAGER_REPORT names the file).

The report has the export report's format (tests/ops/conftest.py, whose merge and write it uses), so
scripts/gen_ops_doc.py reads both.
"""

from __future__ import annotations

import os

import pytest

import torch2jax.eager as te
from tests.ops.conftest import _case, _load, _write, failure_reason, merge_report

_OUTCOMES: dict[str, str] = {}
_REASONS: dict[str, str] = {}
_SAMPLES: dict[str, dict] = {}
_STATE: dict = {"kept": {}, "writer": False}


def pytest_configure(config):
    """Cases this run does not cover keep their recorded outcome (a run over some ops updates those)."""
    path = os.environ.get("T2J_OPINFO_EAGER_REPORT")
    if path and not hasattr(config, "workerinput"):  # only the process that sees every result writes
        _STATE.update(kept=_load(path), writer=True)


@pytest.fixture(scope="session", autouse=True)
def jax_device():
    """The jax device, registered once for the test session (it cannot be unregistered)."""
    te.enable()


def pytest_runtest_logreport(report):
    path = os.environ.get("T2J_OPINFO_EAGER_REPORT")
    if not path or "test_opinfo_eager[" not in report.nodeid or not _STATE["writer"]:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        case = _case(report.nodeid)
        _OUTCOMES[case] = report.outcome
        for name, value in report.user_properties:
            if name == "samples":
                _SAMPLES[case] = value
        if report.failed:
            _REASONS[case] = failure_reason(report.longreprtext)
        quota = os.environ.get("T2J_OPINFO_SAMPLES", "1")
        _write(path, merge_report(_STATE["kept"], _OUTCOMES, _SAMPLES, _REASONS, quota))
