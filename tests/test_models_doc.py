"""docs/models.md is generated from the committed sweep results, never edited by hand."""

from __future__ import annotations

import json

from benchmarks.hf_sweep import report


def test_models_doc_is_what_the_results_give():
    text = report.render(json.loads(report.RESULTS.read_text()), json.loads(report.CONFIGS.read_text()), report.load_generation())
    assert report.DOC.read_text() == text, "docs/models.md is out of date: run python -m benchmarks.hf_sweep.report"


def test_failure_causes_group_rows_that_fail_alike():
    rows = [{"status": "fails in torch.export", "error": "Error: shape [2, 7] at 0x7f1 failed 3 times"},
            {"status": "fails in torch.export", "error": "Error: shape [4, 1] at 0x9a0 failed 12 times"}]
    assert report.cause(rows[0]) == report.cause(rows[1])
    assert report.cause({"status": "mismatch", "error": "after load: logits max abs 0.1"}) == "mismatch after load"
    assert "Torch2JaxError" in report.cause({"status": "fails at save or load", "error": "Torch2JaxError: input 3"})
