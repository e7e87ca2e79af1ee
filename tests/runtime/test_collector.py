"""Long steps run with the objects alive before them frozen for the collector, and leave the process as it was."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import torch

import torch2jax
from torch2jax.runtime import collector


class _Cycle:
    def __init__(self):
        self.me = self


def test_the_block_freezes_what_was_alive_and_thaws_it_after():
    before = _Cycle()
    with collector.existing_objects_frozen():
        assert gc.get_freeze_count() > 0
        made_inside = weakref.ref(_Cycle())
        gc.collect()
        assert made_inside() is None, "garbage made inside the block is still collected"
    assert gc.get_freeze_count() == 0
    dropped = weakref.ref(before)
    del before
    gc.collect()
    assert dropped() is None, "objects frozen during the block are collectable again after it"


def test_a_process_that_froze_its_own_objects_keeps_them_frozen():
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        with collector.existing_objects_frozen():
            pass
        # not thawed (0) and nothing more frozen (above count); frozen objects that other threads' refcounts free
        # meanwhile leave the count, so it may drop a little
        assert 0 < gc.get_freeze_count() <= count
    finally:
        gc.unfreeze()


def test_converting_saving_and_loading_run_frozen_and_leave_nothing_frozen(tmp_path, monkeypatch):
    from torch2jax.capture import converter
    from torch2jax.runtime import artifact

    seen = {}

    def spy(module, name):
        original = getattr(module, name)

        def recorded(*args, **kwargs):
            seen.setdefault(name, gc.get_freeze_count())  # how many objects were frozen when it ran
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)

    for module, name in ((converter, "capture"), (artifact, "start_saving_params"), (artifact, "restore_params")):
        spy(module, name)
    model = torch2jax.convert(torch.nn.Linear(3, 2), (torch.randn(4, 3),))
    torch2jax.save(model, tmp_path / "artifact")
    loaded = torch2jax.load(tmp_path / "artifact")
    assert set(seen) == {"capture", "start_saving_params", "restore_params"} and all(seen.values()), seen
    assert gc.get_freeze_count() == 0
    np.testing.assert_allclose(np.asarray(loaded(np.ones((4, 3), np.float32))),
                               np.asarray(model(np.ones((4, 3), np.float32))), rtol=1e-6)
