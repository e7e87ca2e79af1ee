"""The slow tier (`@pytest.mark.slow`: benchmark-sized configs, more bfloat16 variants) runs only when
asked for with `-m slow` (`make test-models-full`); a plain `pytest tests/models` stays fast."""

from __future__ import annotations


def pytest_collection_modifyitems(config, items):
    if config.option.markexpr:  # an explicit -m decides
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]
