"""The `case` fixture: each tiny LM (cases.py) converted once per test module."""

from __future__ import annotations

import pytest

from tests.finetune.cases import TARGETS, Case, make_case


@pytest.fixture(scope="module", params=sorted(TARGETS))
def case(request) -> Case:
    return make_case(request.param)
