"""Two processes on this machine, 4 simulated CPU devices each, form one (2, 4) mesh over loopback
(jax.distributed): each restores only its own shards, and the outputs (a forward call, generated tokens)
equal the single-process ones."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import torch2jax

PROBE = Path(__file__).with_name("multihost_probe.py")
# two processes converting and loading (~2 CPU-minutes); tests/serve/test_sharding.py runs the 8-device mesh in one
# process in the default tier
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(sharded_lms, tmp_path_factory):
    root = tmp_path_factory.mktemp("multihost")
    artifact, generation = sharded_lms[0][0], sharded_lms[1][0]  # the Llama forward pass and generator
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(PROBE), str(i), port, str(artifact), generation, str(root / f"{i}.npz")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("the two processes did not finish in 300 s (jax.distributed on 127.0.0.1)")
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-4000:]
    from tests.serve.multihost_probe import INPUT

    reference = {"logits": np.asarray(torch2jax.load(artifact)(INPUT)["logits"]),
                 "tokens": torch2jax.load(generation).generate(INPUT[:, :6], max_new_tokens=8)}
    return [dict(np.load(root / f"{i}.npz")) for i in (0, 1)], reference


def test_two_processes_form_one_eight_device_mesh(runs):
    results, _ = runs
    for r in results:
        assert int(r["processes"]) == 2 and int(r["devices"]) == 8


def test_each_process_holds_only_its_own_shards(runs):
    results, _ = runs
    for r in results:
        assert int(r["local_shards"]) == 4 and not bool(r["fully_addressable"])
        assert list(r["shard_devices"]) == list(r["local_devices"])
    assert set(results[0]["local_devices"]).isdisjoint(results[1]["local_devices"])


def test_outputs_equal_the_single_process_ones(runs):
    results, reference = runs
    for r in results:
        np.testing.assert_allclose(r["logits"], reference["logits"], rtol=1e-5, atol=1e-5)


def test_generate_across_processes_equals_the_single_process_tokens(runs):
    results, reference = runs
    for r in results:
        np.testing.assert_array_equal(r["tokens"], reference["tokens"])
