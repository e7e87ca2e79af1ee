"""The OpInfo sweep report (tests/ops/conftest.py): merged case by case, so a sweep can be resumed or run a dtype at a time."""

from .conftest import merge_report


def test_a_run_replaces_its_cases_and_keeps_the_others():
    kept = merge_report({}, {"abs-float32": "failed", "abs-bool": "passed", "neg-float32": "passed"},
                        {"abs-float32": {"passed": 1, "failed": 1}, "abs-bool": {"passed": 5}, "neg-float32": {"passed": 5}},
                        {"abs-float32": "sample 1 off"}, quota="5")
    report = merge_report(kept, {"abs-float32": "passed"}, {"abs-float32": {"passed": 40}}, {}, quota="0")
    assert report["cases"] == {"abs-bool": "passed", "abs-float32": "passed", "neg-float32": "passed"}
    assert report["case_quota"] == {"abs-bool": "5", "abs-float32": "0", "neg-float32": "5"}
    assert report["samples_per_op"] == {"bool": "5", "float32": "0, 5"}
    assert report["samples_by_dtype"] == {"bool": {"passed": 5}, "float32": {"passed": 45}}
    assert report["by_dtype"] == {"bool": {"passed": 1}, "float32": {"passed": 2}}
    assert report["failures"] == {}, "a failure must not outlive the rerun of its case"


def test_an_older_report_without_per_case_samples_is_replaced_by_dtype():
    kept = {"samples_per_op": "5", "by_dtype": {"bool": {"passed": 1}, "float32": {"passed": 2}},
            "samples_by_dtype": {"bool": {"passed": 5}, "float32": {"passed": 10}},
            "cases": {"abs-bool": "passed", "abs-float32": "passed", "neg-float32": "passed"}}
    report = merge_report(kept, {"abs-float32": "passed"}, {"abs-float32": {"passed": 9}}, {}, quota="0")
    assert report["cases"] == {"abs-bool": "passed", "abs-float32": "passed"}
    assert report["samples_per_op"] == {"bool": "5", "float32": "0"}
    assert report["samples_by_dtype"] == {"bool": {"passed": 5}, "float32": {"passed": 9}}
