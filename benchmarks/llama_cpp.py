"""CPU decoding against llama.cpp: one Llama-shaped model as our artifacts and as GGUF files run by llama-cpp-python.

    python -m benchmarks.llama_cpp                 # measure, print, rewrite its section of docs/benchmarks.md
    python -m benchmarks.llama_cpp --no-write --layers 4

The model: a Llama-shaped config of about 0.5B parameters (random weights, seeded; `--layers` makes it shallower),
written by transformers. Ours: `torch2jax.convert_hf` as float32, bfloat16, int8 and int4 (group 32), saved and
loaded. llama.cpp's: GGUF files written here with the `gguf` package (f32, f16, Q8_0, Q4_0: the projections and the
LM head quantized, the input embedding kept f32, as ours), each checked against transformers' logits on the prompt
before it is timed. Batch 1 and 8 (eight prompts at once: llama.cpp's sequences of one batch, each with its own
positions; ours one generate call), prompt 64 tokens, 32 new greedy tokens, medians of `--rounds` runs after a warm-up;
each side once on one core (pinned, one thread) and once on every core, in child processes so that each runtime's
thread pools see only their cores. The memory bound of a row is what its decode step reads (the stored weights but
the input embedding, and the average filled cache) at this machine's measured read bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.report import write_section

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- llama-cpp:begin -->", "<!-- llama-cpp:end -->"
PROMPT, NEW = 64, 32
BATCHES = (1, 8)
CONFIG = dict(vocab_size=32000, hidden_size=1536, intermediate_size=4096, num_hidden_layers=16, num_attention_heads=12,
              num_key_value_heads=4, max_position_embeddings=1024, rms_norm_eps=1e-6, rope_theta=10000.0)
# (our conversion options, llama.cpp's GGUF type): the pairs compared
PAIRS = {"float32 / f32": ({}, "F32"), "bfloat16 / f16": ({"dtype": "bfloat16"}, "F16"),
         "int8 / Q8_0": ({"quantize": "int8"}, "Q8_0"), "int4 (group 32) / Q4_0": ({"quantize": "int4", "group_size": 32}, "Q4_0")}


# -- the model and its GGUF files ------------------------------------------------------------------------------------
def write_model(directory: Path, layers: int) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**CONFIG, "num_hidden_layers": layers})
    transformers.LlamaForCausalLM(config).eval().save_pretrained(directory)


def _rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """A q/k projection's rows from transformers' rotary layout (each head's two halves) to GGML's (pairs adjacent)."""
    out, inp = weight.shape
    return weight.reshape(heads, 2, out // heads // 2, inp).swapaxes(1, 2).reshape(out, inp)


def write_gguf(source: Path, path: Path, kind: str) -> None:
    """The Llama checkpoint in `source` as a GGUF file of type `kind` (F32, F16, Q8_0, Q4_0), with a placeholder
    vocabulary of the model's size (the benchmark feeds token ids)."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((source / "config.json").read_text())
    weights = {}
    for file in sorted(source.glob("*.safetensors")):
        weights.update(load_file(file))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_rope_dimension_count(config["hidden_size"] // heads)
    writer.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7, "Q4_0": 2}[kind])
    vocab = config["vocab_size"]
    writer.add_tokenizer_model("llama")
    writer.add_token_list([b"<unk>", b"<s>", b"</s>", *(f"w{i}".encode() for i in range(3, vocab))])
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                           + [gguf.TokenType.NORMAL] * (vocab - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}

    def add(name: str, array: np.ndarray, matrix: bool) -> None:
        array = np.ascontiguousarray(array.astype(np.float32))
        if not matrix or kind == "F32":
            writer.add_tensor(name, array)
        elif kind == "F16":
            writer.add_tensor(name, array.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)

    add("token_embd.weight", weights["model.embed_tokens.weight"], False)  # kept float32, as our artifacts keep it
    add("output_norm.weight", weights["model.norm.weight"], False)
    add("output.weight", weights.get("lm_head.weight", weights["model.embed_tokens.weight"]), True)
    for layer in range(config["num_hidden_layers"]):
        for ours, theirs in names.items():
            array = weights[f"model.layers.{layer}.{ours}.weight"]
            if theirs in ("attn_q", "attn_k"):
                array = _rope_rows(array, heads if theirs == "attn_q" else kv_heads)
            add(f"blk.{layer}.{theirs}.weight", array, array.ndim == 2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# -- timing (in a child process per thread setting) ------------------------------------------------------------------
def _llama(path: Path, threads: int):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), n_ctx=PROMPT + NEW + 8, n_batch=PROMPT, n_threads=threads,
                           n_threads_batch=threads, logits_all=False, verbose=False)


def _last_logits(llm) -> np.ndarray:
    """The last evaluated token's logits, read from the context (Llama.scores holds them only with logits_all)."""
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))


def llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    """llama.cpp's logits after the prompt (its file checked against transformers' before it is timed)."""
    llm = _llama(path, os.cpu_count() or 1)
    llm.eval(ids)
    return _last_logits(llm).copy()


def time_llama_cpp(path: Path, ids: list[int], threads: int, rounds: int) -> tuple[float, float]:
    """(prefill s, decode tok/s) of greedy decoding with llama-cpp-python, medians over rounds after a warm-up."""
    llm = _llama(path, threads)

    def run() -> tuple[float, float]:
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids)
        token = int(np.argmax(_last_logits(llm)))
        first = time.perf_counter()
        for _ in range(NEW - 1):
            llm.eval([token])
            token = int(np.argmax(_last_logits(llm)))
        end = time.perf_counter()
        return first - start, (NEW - 1) / (end - first)

    run()
    runs = [run() for _ in range(rounds)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def time_llama_cpp_rows(path: Path, rows: list[list[int]], threads: int, rounds: int) -> tuple[float, float]:
    """(prefill s, decode tok/s per row) of greedy decoding of several prompts at once: one llama.cpp context with a
    sequence per prompt, each step one batch of every sequence's next token (llama-cpp-python's Llama drives one
    sequence, so the batch is built with its low-level API)."""
    import llama_cpp
    from llama_cpp import _internals

    llm = _llama(path, threads)  # the model, loaded once
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = len(rows) * (PROMPT + NEW + 8)
    params.n_batch = params.n_ubatch = len(rows) * PROMPT
    params.n_seq_max = len(rows)
    params.n_threads = params.n_threads_batch = threads
    ctx = _internals.LlamaContext(model=llm._model, params=params, verbose=False)
    batch = _internals.LlamaBatch(n_tokens=len(rows) * PROMPT, embd=0, n_seq_max=len(rows), verbose=False)
    vocab = llm.n_vocab()

    def step(tokens: list[list[int]], start: int) -> list[int]:
        """Every row's tokens at positions start.., then each row's greedy next token."""
        b, n, last = batch.batch, 0, []
        for row, ids in enumerate(tokens):
            for i, token in enumerate(ids):
                b.token[n], b.pos[n], b.n_seq_id[n], b.logits[n] = token, start + i, 1, i == len(ids) - 1
                b.seq_id[n][0] = row
                n += 1
            last.append(n - 1)
        b.n_tokens = n
        ctx.decode(batch)
        return [int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx.ctx, i), shape=(vocab,))))
                for i in last]

    def run() -> tuple[float, float]:
        llama_cpp.llama_memory_clear(ctx.memory, True)
        start = time.perf_counter()
        tokens = step(rows, 0)
        first = time.perf_counter()
        for i in range(NEW - 1):
            tokens = step([[t] for t in tokens], PROMPT + i)
        end = time.perf_counter()
        return first - start, (NEW - 1) / (end - first)

    run()
    runs = [run() for _ in range(rounds)]
    ctx.close()
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def child(work: Path, threads: int, rounds: int) -> None:
    """Time every pair at `threads` (1: pinned to one core) and print the rows as JSON lines."""
    if threads == 1:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    import torch

    import torch2jax
    from benchmarks.generation import time_ours

    torch.set_num_threads(threads)
    for label, (_, kind) in PAIRS.items():
        g = torch2jax.load(work / f"ours-{kind}")
        for batch in BATCHES:
            ids = np.random.default_rng(0).integers(3, CONFIG["vocab_size"], (batch, PROMPT))
            ttft, rate = time_ours(g, ids, rounds, new=NEW)
            row = {"label": label, "threads": threads, "batch": batch}
            print(json.dumps({**row, "side": "ours", "ttft": ttft, "rate": rate * batch}), flush=True)
            path = work / f"{kind}.gguf"
            prefill, rate = (time_llama_cpp(path, ids[0].tolist(), threads, rounds) if batch == 1 else
                             time_llama_cpp_rows(path, ids.tolist(), threads, rounds))
            print(json.dumps({**row, "side": "llama.cpp", "ttft": prefill, "rate": rate * batch}), flush=True)


# -- the run ---------------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--child", nargs=3, metavar=("WORK", "THREADS", "ROUNDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), int(args.child[1]), int(args.child[2]))
        return
    import torch
    import transformers

    import torch2jax
    from benchmarks.generation import bandwidth_bytes_per_s

    with tempfile.TemporaryDirectory(prefix="bench-llama-cpp-") as tmp:
        work = Path(tmp)
        write_model(work / "hf", args.layers)
        model = transformers.AutoModelForCausalLM.from_pretrained(work / "hf", local_files_only=True).eval()
        ids = np.random.default_rng(0).integers(3, CONFIG["vocab_size"], (1, PROMPT))
        with torch.no_grad():
            want = model(torch.from_numpy(ids)).logits[0, -1].numpy()
        sizes, gaps = {}, {}
        for label, (options, kind) in PAIRS.items():
            print(f"writing {label}", flush=True)
            g = torch2jax.convert_hf(work / "hf", max_cache_len=PROMPT + NEW, max_batch=max(BATCHES), stream_weights=True,
                                     **options)
            saved = torch2jax.save(g, work / f"ours-{kind}", platforms=["cpu"])
            write_gguf(work / "hf", work / f"{kind}.gguf", kind)
            embedding = CONFIG["vocab_size"] * CONFIG["hidden_size"] * 4
            sizes[label] = (sum(p.stat().st_size for p in (saved / "params").rglob("*") if p.is_file()) - embedding,
                            (work / f"{kind}.gguf").stat().st_size - embedding)
            logits = llama_cpp_logits(work / f"{kind}.gguf", ids[0].tolist())
            gaps[label] = float(np.abs(logits - want).max() / np.abs(want).max())
            print(f"  llama.cpp {kind}: largest logit gap {gaps[label]:.2e} of the largest logit", flush=True)
        del model
        bandwidth = bandwidth_bytes_per_s()
        rows = []
        for threads in (1, os.cpu_count() or 1):
            command = [sys.executable, "-m", "benchmarks.llama_cpp", "--child", str(work), str(threads), str(args.rounds)]
            out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
            rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            print("\n".join(line for line in out.splitlines() if line.startswith("{")), flush=True)
    text = report(rows, sizes, gaps, bandwidth, args)
    print(text)
    if not args.no_write:
        write_section(args.out, text, BEGIN, END)
        print(f"wrote the llama.cpp section of {args.out}")


def report(rows: list[dict], sizes: dict, gaps: dict, bandwidth: float, args) -> str:
    kv = 2 * args.layers * CONFIG["num_key_value_heads"] * (CONFIG["hidden_size"] // CONFIG["num_attention_heads"])
    cache = kv * (PROMPT + NEW // 2) * 4
    lines = ["| weights (ours / llama.cpp) | batch | threads | ours: prefill ms | llama.cpp: prefill ms | ours: decode tok/s | "
             "llama.cpp: decode tok/s | ours vs llama.cpp | ours: of bound | llama.cpp: of bound | llama.cpp logit gap |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label in PAIRS:
        for batch in BATCHES:
            for threads in sorted({r["threads"] for r in rows}):
                ours, theirs = (next(r for r in rows if r["label"] == label and r["threads"] == threads
                                     and r.get("batch", 1) == batch and r["side"] == side) for side in ("ours", "llama.cpp"))
                # a step reads the weights once for every row and each row's own cache
                bounds = [batch * bandwidth / (size + batch * cache) for size in sizes[label]]
                lines.append(f"| {label} | {batch} | {threads} | {ours['ttft'] * 1e3:.0f} | {theirs['ttft'] * 1e3:.0f} | "
                             f"{ours['rate']:.1f} | {theirs['rate']:.1f} | {ours['rate'] / theirs['rate']:.2f}x | "
                             f"{ours['rate'] / bounds[0]:.0%} | {theirs['rate'] / bounds[1]:.0%} | {gaps[label]:.1e} |")
    return f"""{BEGIN}
## Against llama.cpp (CPU)

A Llama-shaped model of {args.layers} layers (hidden {CONFIG['hidden_size']}, MLP {CONFIG['intermediate_size']},
{CONFIG['num_attention_heads']} heads, {CONFIG['num_key_value_heads']} key/value heads, vocabulary
{CONFIG['vocab_size']}; random weights), batch {' and '.join(map(str, BATCHES))}, prompt {PROMPT} tokens, {NEW} new greedy
tokens, medians of
{args.rounds} runs. Ours: `torch2jax.convert_hf` saved and loaded; llama.cpp: llama-cpp-python over GGUF files
written from the same checkpoint (benchmarks/llama_cpp.py), the input embedding kept f32 on both sides. "Logit gap":
llama.cpp's largest difference from transformers' logits on the prompt, as a share of the largest logit (its own
rounding: f16, Q8_0, Q4_0). Prefill is the prompts to the first token; decode tok/s counts every row's tokens; the
bound is the decode step's reads (the weights once, each row's cache) at {bandwidth / 1e9:.1f} GB/s. At batch 8
llama.cpp decodes its eight sequences as one batch per step (llama-cpp-python's low-level API). 2 shared CPU cores.
Written by `python -m benchmarks.llama_cpp`.

{chr(10).join(lines)}
{END}"""


if __name__ == "__main__":
    main()
