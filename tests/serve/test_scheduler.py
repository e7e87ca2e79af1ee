"""Continuous batching (serve/engine.py, serve/scheduler.py) against Generator.generate: every request's tokens
equal that request generated alone, whatever joins or leaves the batch around it; and the text rules
(stop strings, chat templates) against transformers' own."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.generate.text import ChatTemplate, TextStream
from torch2jax.serve.engine import BatchEngine, Sampling
from torch2jax.serve.scheduler import QueueFull, Request, Scheduler

from ..generate.lms import write_lm

CACHE, ROWS, CHUNK = 64, 4, 16


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """A 4-row batch over llama (full attention) or mistral (a sliding window of 8, shorter than most replies),
    each converted once; the tests share it (its jitted steps compile once), each with a scheduler of its own."""
    root = tmp_path_factory.mktemp("sched")
    made = {}

    def get(name: str) -> BatchEngine:
        if name not in made:
            g = torch2jax.convert_hf(f"hf:{write_lm(name, root)}", max_cache_len=CACHE, max_batch=ROWS)
            made[name] = BatchEngine(g, ROWS, chunk=CHUNK)
        assert not made[name].running.any(), "a test left rows running"
        return made[name]

    return get


def run(scheduler: Scheduler, arrivals: dict[int, list[Request]], limit: int = 600) -> None:
    """Step the loop on this thread, submitting each request at its step, until everything has ended."""
    for step in range(limit):
        for request in arrivals.pop(step, []):
            scheduler.submit(request)
        if not arrivals and not scheduler._busy():
            return
        scheduler.step()
    raise AssertionError(f"not done after {limit} steps: {scheduler.stats()}")


def requests(count: int, seed: int, sampled: bool = False) -> list[Request]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        length = int(rng.integers(1, 40))
        settings = Sampling(float(rng.uniform(0.5, 1.5)), int(rng.integers(0, 20)), float(rng.uniform(0.6, 1.0)), seed=i) \
            if sampled and i % 2 else Sampling()
        out.append(Request(rng.integers(3, 128, length).tolist(), int(rng.integers(1, CACHE - length + 1)), lambda e: None,
                           settings, end_tokens=()))
    return out


def alone(g, request: Request) -> list[int]:
    s = request.sampling
    options = dict(do_sample=True, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, rng=jax.random.key(s.seed)) \
        if s.temperature > 0 else {}
    out = g.generate(np.array([request.prompt]), max_new_tokens=request.max_tokens, eos_token_id=[], **options)
    return out[0, len(request.prompt):].tolist()


@pytest.mark.parametrize("name", ["llama", pytest.param("mistral", marks=pytest.mark.slow)])  # mistral: its sliding window
def test_each_request_gets_what_it_gets_alone(name, engines):
    """8 requests (prompts 1-39 tokens, chunked by 16; replies up to the whole cache) arriving two per step
    into 4 rows: greedy ones equal generate's tokens, sampled ones (llama) equal generate's draws with the same key.
    Steps run one decode step while requests wait, then blocks of up to 16 once none does (ending when a row
    reaches its length). Every row holds its own tokens from slot 0, and never more than 4 rows are held."""
    scheduler = Scheduler(engines(name), max_queue=16)
    g = scheduler.engine.g
    batch = requests(8, seed=1, sampled=name == "llama")
    run(scheduler, {i: batch[2 * i: 2 * i + 2] for i in range(4)})
    for r in batch:
        assert r.tokens == alone(g, r), (len(r.prompt), r.max_tokens, r.sampling)
    assert scheduler.max_rows_held == ROWS and not scheduler.engine.lengths.any()
    assert scheduler.engine.decode_steps > scheduler.steps, scheduler.stats()  # blocks ran
    assert not scheduler.engine.running.any() and scheduler.rows_held == 0


class AnyToken:
    """A structured-output constraint that allows every token and never completes (serve/structured.py's interface)."""

    def fill(self, row: np.ndarray) -> None:
        row[:] = -1

    def advance(self, token: int) -> bool:
        return False


def test_after_compile_steps_a_mixed_load_compiles_nothing(engines, tmp_path):
    """The server's warm-up: after compile_steps, requests of every group size, prompts of one to three chunks, greedy,
    sampled, with log-probabilities and penalties and with an allowed-token mask, run without a
    compilation. The artifact is saved and loaded, as `serve` does (params on the device), and the engine is new, so
    nothing a test before compiled counts."""
    g = torch2jax.load(torch2jax.save(engines("llama").g, tmp_path / "llm"))
    engine = BatchEngine(g, ROWS, chunk=CHUNK)
    assert engine.step_shapes() == {"groups": [1, 2, 4], "chunks": {k: [(16, 16), (16, 64)] for k in (1, 2, 4)},
                                    "spans": [64]}
    # decode: greedy or sampled, with extras or not, and with an allowed-token mask (structured output); count_from
    assert engine.compile_steps(workers=2) == 3 + 3 + 4 + 2 + 1
    steps = [g._prefill, engine._pick_jit, engine._join, engine._decode, engine._count_from]
    compiled = [f._cache_size() for f in steps]
    rng = np.random.default_rng(3)
    kinds = [lambda i: Sampling(0.8, seed=i), lambda i: Sampling(), lambda i: Sampling(logprobs=2, frequency_penalty=0.5),
             lambda i: Sampling(0.8, seed=i, logprobs=0, presence_penalty=-1.0)]
    load = [Request(rng.integers(3, 128, int(rng.integers(1, 40))).tolist(), int(rng.integers(1, 17)), lambda e: None,
                    kinds[i % 4](i), end_tokens=()) for i in range(14)]
    load[3].constraint = load[12].constraint = AnyToken()  # masked first-token picks and decode steps
    scheduler = Scheduler(engine)
    run(scheduler, {0: load[:4], 1: load[4:5], 6: load[5:7], 9: load[7:11], 20: load[11:]})
    assert scheduler.max_rows_held == ROWS
    assert [f._cache_size() for f in steps] == compiled


def test_a_short_request_finishes_while_a_long_one_runs(engines):
    scheduler = Scheduler(engines("llama"), max_queue=4)
    g = scheduler.engine.g
    order = []
    long = Request(list(range(3, 30)), 30, lambda e: e.finish_reason and order.append("long"), end_tokens=())
    short = Request([5, 6, 7], 4, lambda e: e.finish_reason and order.append("short"), end_tokens=())
    run(scheduler, {0: [long], 1: [short]})  # the long one decodes a block alone, then both until the short one ends
    assert order == ["short", "long"] and short.tokens == alone(g, short) and long.tokens == alone(g, long)


def test_end_token_and_cancel_free_the_row(engines):
    scheduler = Scheduler(engines("llama"), max_queue=4)
    g = scheduler.engine.g
    free = alone(g, Request([9, 8, 7], 12, None, end_tokens=()))
    events = []
    ended = Request([9, 8, 7], 12, events.append, end_tokens=(free[4],))
    cancelled = Request([4, 5], 30, lambda e: None, end_tokens=())
    after = Request([11, 12], 5, lambda e: None, end_tokens=())
    run(scheduler, {0: [ended]})
    first_end = free.index(free[4])
    assert ended.tokens == free[: first_end + 1] and events[-1].finish_reason == "stop"
    assert events[-1].completion_tokens == first_end + 1 and events[-1].prompt_tokens == 3
    scheduler.submit(cancelled)
    scheduler.engine.decode_block = 1  # one decode step per loop step, to cancel at a known token
    try:
        for _ in range(3):
            scheduler.step()
        assert scheduler.rows_held == 1 and len(cancelled.tokens) == 4  # the prefill's token, then one per decode step
        cancelled.cancel()
        scheduler.step()
    finally:
        scheduler.engine.decode_block = 16
    assert scheduler.rows_held == 0 and len(cancelled.tokens) == 4 and not scheduler.engine.running.any()
    run(scheduler, {0: [after]})
    assert after.tokens == alone(g, after)


def test_bad_requests_and_a_full_queue_are_refused(engines):
    scheduler = Scheduler(engines("llama"), max_queue=2)
    with pytest.raises(InputSpecError, match=r"a prompt of 50 tokens plus max_tokens=20 needs 70 cache slots, more than .* \(64\)"):
        scheduler.submit(Request([5] * 50, 20, None))
    with pytest.raises(InputSpecError, match=r"outside the vocabulary \[0, 128\)"):
        scheduler.submit(Request([5, 128], 2, None))
    with pytest.raises(InputSpecError, match="temperature must be >= 0"):
        Sampling(temperature=-1.0)
    with pytest.raises(torch2jax.Torch2JaxError, match=r"top_p must be in \(0, 1\]"):
        Sampling(temperature=1.0, top_p=1.5)
    with pytest.raises(InputSpecError, match="this artifact was converted for batches of 1 to 4"):
        BatchEngine(scheduler.engine.g, 5)
    for _ in range(2):
        scheduler.submit(Request([5], 2, lambda e: None))
    with pytest.raises(QueueFull):
        scheduler.submit(Request([5], 2, lambda e: None))
    scheduler.waiting.clear()


class Words:
    """A stand-in tokenizer: token i decodes to the i-th word, joined without spaces."""

    def __init__(self, words):
        self.words = words

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.words[i] for i in ids)


def test_stop_strings_are_held_back_and_never_sent():
    stream = TextStream(Words(["Hel", "lo", " ST", "OP", " more"]), stop=["STOP"])
    sent = [stream.push(t) for t in range(4)]
    assert sent == [("Hel", False), ("lo", False), (" ", False), ("", True)]
    assert stream.text == "Hello " and stream.flush() == ""
    partial = TextStream(Words(["a", "S", "T", "b"]), stop=["STOP", "Tb!"])
    assert [partial.push(t)[0] for t in range(4)] + [partial.flush()] == ["a", "", "", "S", "Tb"]
    earliest = TextStream(Words(["xAB", "C"]), stop=["BC", "ABC"])
    assert earliest.push(0) == ("x", False) and earliest.push(1) == ("", True) and earliest.text == "x"


def test_chat_template_renders_as_transformers_does():
    from jinja2.exceptions import TemplateError
    from transformers.utils.chat_template_utils import render_jinja_template

    source = ("{{ bos_token }}{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
              "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}\n  {{ m['role'] }}: {{ m['content'] | trim }}"
              "{% if not loop.last %}{{ eos_token }}{% endif %}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
              "{{ messages | tojson }}")
    messages = [{"role": "system", "content": "be <brief>"}, {"role": "user", "content": " hi "}]
    template = ChatTemplate(source, {"bos_token": "<s>", "eos_token": "</s>"})
    want, _ = render_jinja_template([messages], chat_template=source, add_generation_prompt=True, bos_token="<s>",
                                    eos_token="</s>")
    assert template.render(messages) == want[0]
    with pytest.raises(TemplateError, match="unknown role tool"):
        render_jinja_template([[{"role": "tool", "content": "x"}]], chat_template=source)
    with pytest.raises(InputSpecError, match="unknown role tool"):
        template.render([{"role": "tool", "content": "x"}])


def test_a_prefill_budget_narrows_the_chunks_of_big_groups(engines):
    """With 64-token chunks and a budget of 32 prompt tokens per step, a lone request is prefilled 32 tokens at a time and
    a group of four 16 at a time (the narrowest chunk); every reply still equals the request generated alone."""
    g = engines("llama").g
    engine = BatchEngine(g, ROWS, chunk=64, prefill_tokens=32)
    assert [engine.chunk_for(k) for k in (1, 2, 4)] == [32, 16, 16]
    shapes, prefill = [], engine._prefill

    def spy(cache, ids, *rest):
        shapes.append(ids.shape)
        return prefill(cache, ids, *rest)

    engine._prefill = spy
    scheduler = Scheduler(engine, max_queue=16)
    batch = requests(6, seed=5)
    run(scheduler, {0: batch[:1], 1: batch[1:5], 40: batch[5:]})
    for r in batch:
        assert r.tokens == alone(g, r), (len(r.prompt), r.max_tokens)
    assert shapes and all(rows * width <= max(32, 16 * rows) for rows, width in shapes), shapes
    assert any(rows == 4 for rows, _ in shapes), shapes
    with pytest.raises(InputSpecError, match="prefill budget"):
        BatchEngine(g, ROWS, prefill_tokens=8)


def test_each_row_holds_its_own_tokens_from_slot_0(engines):
    """A short request joining a running long one is written at its own slots: its row of the batch cache holds, at
    slots 0 .. n - 1, what a prefill of its tokens alone writes there (nothing rolled, nothing shifted by the long
    row), and a row that ends holds nothing."""
    engine = engines("llama")
    scheduler = Scheduler(engine, max_queue=4)
    g = engine.g
    long = Request(list(range(3, 40)), 20, lambda e: None, end_tokens=())
    short = Request([5, 6, 7, 8, 9], 12, lambda e: None, end_tokens=())
    engine.decode_block = 1
    try:
        scheduler.submit(long)
        for _ in range(4):
            scheduler.step()
        scheduler.submit(short)
        while len(short.tokens) < 3:
            scheduler.step()
        row, other = scheduler.slots.index(short), scheduler.slots.index(long)
        held = len(short.prompt) + len(short.tokens) - 1  # the last token is the next step's input
        assert engine.lengths[row] == held and engine.lengths[other] == len(long.prompt) + len(long.tokens) - 1
        tokens = np.array([short.prompt + short.tokens[:-1]])
        slots = np.arange(held)
        _, own = g.prefill(g.new_cache(1), tokens, slots[None], slots, np.ones((1, held), bool))
        for batch_tensor, alone_tensor in zip(engine.cache, own):
            np.testing.assert_allclose(np.asarray(batch_tensor[row, :, :held]), np.asarray(alone_tensor[0, :, :held]),
                                       rtol=1e-5, atol=1e-5)
        run(scheduler, {})
    finally:
        engine.decode_block = 16
    assert short.tokens == alone(g, short) and long.tokens == alone(g, long)
    assert not engine.lengths.any() and not engine.running.any()


def test_an_artifact_whose_rows_share_their_slots_generates_but_is_not_served(tmp_path, monkeypatch):
    """A step traced as older torch2jax traced it (one `write_at` [T] for every row) still generates what transformers
    does, and the server's engine refuses it, saying to convert it again."""
    from functools import partial

    import torch

    from torch2jax.hf.steps import causal_lm

    from ..generate.lms import hf_greedy, load_lm

    monkeypatch.setattr(causal_lm, "example_step_inputs", partial(causal_lm.example_step_inputs, rows_apart=False))
    monkeypatch.setattr(causal_lm, "step_dynamic_shapes", partial(causal_lm.step_dynamic_shapes, rows_apart=False))
    path = write_lm("llama", tmp_path)
    g = torch2jax.convert_hf(f"hf:{path}", max_cache_len=CACHE, max_batch=2)
    assert len(g.prefill_model.graph.user_inputs[2].meta.shape) == 1  # [tokens]: one write_at for every row
    ids = np.array([[5, 6, 7, 8], [0, 9, 10, 11]])
    mask = np.array([[1, 1, 1, 1], [0, 1, 1, 1]], bool)
    want = hf_greedy(load_lm(path), torch.from_numpy(ids), 6, torch.from_numpy(mask).long())
    np.testing.assert_array_equal(g.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[]), want)
    with pytest.raises(InputSpecError, match="converted by an older torch2jax.*Convert it again"):
        BatchEngine(g, 2)


def test_a_chunk_writes_real_tokens_at_their_positions_and_pads_past_them():
    """Columns of a left-padded group (lengths 8, 3 and a pad row): each real token goes to its position, each pad
    column to a slot of its own past the row's real tokens and within the chunk's span, and a row attends to its real
    tokens only (a pad column's own slot comes from the step's own-slot rule)."""
    from torch2jax.serve.engine import chunk_slots

    mask = np.zeros((3, 8), bool)
    mask[0], mask[1, 5:] = True, True
    for lo, hi in ((0, 4), (4, 8)):
        positions, write_at, valid = chunk_slots(mask, lo, hi, hi)
        for row in range(3):
            real = mask[row, lo:hi]
            first = 8 - int(mask[row].sum())
            assert (write_at[row, real] == np.arange(lo, hi)[real] - first).all()
            assert (positions[row, real] == write_at[row, real]).all() and (positions[row, ~real] == 0).all()
            filled = max(hi - first, 0)
            assert (write_at[row, ~real] >= filled).all() and (write_at[row] < hi).all()
            assert len(set(write_at[row].tolist())) == hi - lo
            assert (valid[row] == (np.arange(hi) < filled)).all()
