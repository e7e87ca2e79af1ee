"""LoRA adapters served beside the base model (`torch2jax serve ART --lora NAME=DIR`): a request's `model` chooses the
adapter, rows of different adapters share one batch, and each reply is token for token what that adapter generates.

The adapters are written by peft itself (get_peft_model, random A and B, save_pretrained). The reference for a reply is
transformers + peft's own greedy generate with that adapter (torch: what the adapter means), and the artifact's
Generator.generate with the adapter merged into its params (finetune.merge: the artifact's own StableHLO steps, so a
difference would be the side path's or the engine's, not the conversion's); the two must agree before the server is
compared with them. The app runs in process (httpx over ASGI, nothing listens), its scheduler started only once all
requests wait, so that they are admitted as one group and decode in one batch; the CLI runs for its option and errors.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import numpy as np
import peft
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.finetune import load_adapter, merge
from torch2jax.serve.api import build_service, create_app
from torch2jax.serve.engine import BASE

from ..generate.lms import EOS, PAD, load_lm, write_lm, write_tokenizer
from ..helpers import cli

CACHE, ROWS, NEW = 32, 4, 8
ADAPTERS = {"sql": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
            "chat": dict(r=2, lora_alpha=6, target_modules=["q_proj", "o_proj", "down_proj"])}
REQUESTS = [("sql", [5, 9, 33, 17]), ("chat", [5, 9, 33, 17]), ("llm", [5, 9, 33, 17]), ("sql", [40, 41, 42, 43, 44, 45, 46])]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny Llama artifact with a word-level tokenizer, two peft adapters of it, and each model's reference tokens for
    each request's prompt: {(model, prompt): tokens}."""
    root = tmp_path_factory.mktemp("lora_serving")
    source = write_lm("llama", root)
    write_tokenizer(source)
    artifact = torch2jax.save(torch2jax.convert_hf(f"hf:{source}", max_cache_len=CACHE, max_batch=ROWS), root / "llm")
    dirs, peft_tokens = {}, {}
    generator = torch.Generator().manual_seed(0)
    for name, options in ADAPTERS.items():
        pm = peft.get_peft_model(load_lm(source), peft.LoraConfig(lora_dropout=0.0, **options)).eval()
        with torch.no_grad():
            for key, value in pm.named_parameters():
                if "lora_" in key:
                    value.copy_(torch.randn(value.shape, generator=generator) * 0.15)
        pm.save_pretrained(root / name)
        dirs[name] = root / name
        for _, prompt in REQUESTS:
            with torch.no_grad():
                out = pm.generate(input_ids=torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, pad_token_id=PAD,
                                  eos_token_id=EOS)
            peft_tokens[name, tuple(prompt)] = until_eos(out[0, len(prompt):].tolist())
    want = {}
    for name in ("llm", *ADAPTERS):
        g = torch2jax.load(artifact)
        if name != "llm":
            lora, config = load_adapter(dirs[name])
            g.prefill_model.params = g.decode_model.params = merge(g.params, lora, config)
        for _, prompt in REQUESTS:
            want[name, tuple(prompt)] = until_eos(g.generate(np.array([prompt]), max_new_tokens=NEW)[0, len(prompt):].tolist())
    for key, tokens in peft_tokens.items():  # the merged artifact generates what transformers + peft does
        assert want[key] == tokens, (key, want[key], tokens)
    prompt = tuple(REQUESTS[0][1])
    assert len({tuple(want[name, prompt]) for name in ("llm", *ADAPTERS)}) == 3, "each model must answer differently"
    return artifact, dirs, want


def until_eos(tokens: list[int]) -> list[int]:
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens


def words(ids: list[int]) -> str:
    return " ".join(f"w{t}" for t in ids)


def text_of(ids: list[int]) -> str:
    return words([t for t in ids if t != EOS])


def lora_options(dirs: dict) -> list[tuple[str, str]]:
    return [(name, str(path)) for name, path in dirs.items()]


async def ask_together(service, bodies: list[dict], extra: list[tuple[str, str]] = ()) -> tuple[list[httpx.Response], dict]:
    """Post every body at once; start the scheduler's loop once all of them wait, so they join one batch. Then GET each
    path of `extra`. Returns the answers and {path: answer}."""
    app = create_app(service)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://served", timeout=120) as client:
        posts = [asyncio.create_task(client.post("/v1/completions", json=body)) for body in bodies]
        for _ in range(1000):
            if service.scheduler.queue_depth == len(bodies):
                break
            await asyncio.sleep(0.01)
        assert service.scheduler.queue_depth == len(bodies), "the requests did not all queue"
        service.scheduler.start()
        try:
            answers = await asyncio.wait_for(asyncio.gather(*posts), 120)
            got = {path: await client.get(path) for path in extra}
        finally:
            service.scheduler.stop()
    return answers, got


def test_adapters_and_the_base_in_one_batch_each_equal_generating_with_that_adapter_merged(served):
    artifact, dirs, want = served
    service = build_service(artifact, lora=lora_options(dirs), warm_up="all", chunk=16)
    bodies = [{"model": model, "prompt": words(prompt), "max_tokens": NEW, "temperature": 0} for model, prompt in REQUESTS]
    answers, got = asyncio.run(ask_together(service, bodies, ["/v1/models", "/metrics", "/health"]))
    for (model, prompt), answer in zip(REQUESTS, answers):
        assert answer.status_code == 200, answer.text
        reply = answer.json()
        assert reply["model"] == model
        assert reply["choices"][0]["text"] == text_of(want[model, tuple(prompt)]), (model, prompt)
        assert reply["usage"]["completion_tokens"] == len(want[model, tuple(prompt)])
    stats = got["/health"].json()
    # the four were prefilled as one group and decoded together: three models (two adapters and the base) in a step
    assert stats["max_rows_held"] == len(REQUESTS) and stats["max_models_per_step"] == 3, stats
    cards = got["/v1/models"].json()["data"]
    assert [card["id"] for card in cards] == ["llm", "sql", "chat"]
    assert "parent" not in cards[0] and all(card["parent"] == "llm" for card in cards[1:])
    assert [card["root"] for card in cards[1:]] == [str(dirs["sql"].resolve()), str(dirs["chat"].resolve())]
    metrics = got["/metrics"].text
    for model, count in (("sql", 2), ("chat", 1), ("llm", 1)):
        assert f'torch2jax_model_requests_total{{model="{model}"}} {count}.0' in metrics, metrics


def test_a_model_the_server_does_not_serve_gets_404_naming_the_served_ones(served):
    artifact, dirs, want = served
    service = build_service(artifact, lora=lora_options(dirs), warm_up="short")
    bodies = [{"model": "sql-v2", "prompt": "w5", "max_tokens": 2}, {"prompt": words([5, 9, 33, 17]), "max_tokens": NEW,
                                                                     "temperature": 0}]

    async def run():
        app = create_app(service)
        service.scheduler.start()
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://served", timeout=120) as c:
                return [await c.post("/v1/completions", json=body) for body in bodies]
        finally:
            service.scheduler.stop()

    unknown, unnamed = asyncio.run(run())
    error = unknown.json()["error"]
    assert unknown.status_code == 404 and (error["param"], error["code"]) == ("model", "model_not_found")
    assert "The model 'sql-v2' does not exist (this server serves 'llm', 'sql', 'chat')" in error["message"]
    # a request that names no model runs on the base model
    assert unnamed.json()["model"] == "llm" and unnamed.json()["choices"][0]["text"] == text_of(want["llm", (5, 9, 33, 17)])


def test_without_adapters_the_engine_runs_the_generators_own_steps(served):
    artifact, _, _ = served
    service = build_service(artifact, warm_up="short")
    assert service.scheduler.engine.adapters is None and service.adapters == []
    assert "max_models_per_step" not in service.scheduler.stats()
    from torch2jax.serve.scheduler import Request

    with pytest.raises(InputSpecError, match=r"adapter 0: this engine holds 0 adapters"):
        service.scheduler.submit(Request([5], 2, lambda e: None, adapter=0))
    assert BASE == -1


def test_adapters_that_cannot_be_served_are_refused_at_startup_naming_them(served, tmp_path):
    artifact, dirs, _ = served
    sql = str(dirs["sql"])
    not_peft = tmp_path / "not_peft"
    not_peft.mkdir()
    (not_peft / "config.json").write_text("{}")
    other = tmp_path / "other"  # an adapter for a wider model: its lora_A rows do not fit the artifact's q_proj
    shutil.copytree(dirs["sql"], other)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(other / "adapter_model.safetensors"))
    save_file({k: np.concatenate([v, v], axis=1) if "lora_A" in k else v for k, v in tensors.items()},
              str(other / "adapter_model.safetensors"), metadata={"format": "pt"})
    ia3 = tmp_path / "ia3"
    shutil.copytree(dirs["sql"], ia3)
    config = json.loads((ia3 / "adapter_config.json").read_text())
    (ia3 / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "IA3"}))
    nowhere = tmp_path / "nowhere"  # an adapter of a module this model does not have
    shutil.copytree(dirs["sql"], nowhere)
    save_file({k.replace("q_proj", "qkv_proj"): v for k, v in tensors.items()}, str(nowhere / "adapter_model.safetensors"),
              metadata={"format": "pt"})
    cases = [
        ([("sql", str(tmp_path / "missing"))], r"--lora sql=.*missing: .* is not a directory; give the PEFT adapter directory"),
        ([("sql", str(not_peft))], r"--lora sql=.*not_peft: not a LoRA adapter .*needs adapter_config\.json"),
        ([("sql", str(ia3))], r"--lora sql=.*ia3: not a LoRA adapter .*'peft_type': 'IA3'"),
        ([("chat", str(dirs["chat"])), ("sql", str(nowhere))], r"--lora sql=.*nowhere: the adapter does not fit this "
                                                               r"artifact's weights \(.*qkv_proj"),
        ([("sql", sql), ("wide", str(other))], r"--lora wide=.*other: the adapter does not fit this artifact's weights "
                                               r"\(.*lora_A \(4, 128\).*was it trained on the model"),
        ([("sql", sql), ("sql", sql)], r"--lora sql=.*: the name 'sql' is given to two adapters"),
        ([("llm", sql)], r"--lora llm=.*: 'llm' is the base model's name; give the adapter another NAME"),
    ]
    for lora, message in cases:
        with pytest.raises(InputSpecError, match=message):
            build_service(artifact, lora=lora, warm_up="short")
    # the CLI: the same refusal as one paragraph and exit 2, and a value that is not NAME=DIR
    refused = cli("serve", str(artifact), "--lora", f"sql={sql}", "--lora", f"sql={sql}", "--port", "1")
    assert refused.returncode == 2 and "the name 'sql' is given to two adapters" in refused.stderr
    assert "Traceback" not in refused.stderr
    malformed = cli("serve", str(artifact), "--lora", sql, "--port", "1")
    assert malformed.returncode == 2 and "is not NAME=DIR" in malformed.stderr and "Traceback" not in malformed.stderr
