"""The generation sweep: every generating class of transformers (causal LM, encoder-decoder, image-text-to-text), built
from the architecture sweep's recorded configs, converted for generation, and its greedy tokens compared with
transformers' own `generate`, before and after save + load.

    python -m benchmarks.hf_sweep.generation [--only TYPE ...] [--shard I/N] [--limit N] [--timeout S] [--rerun]
    make test-generation-hf

A row: the model from configs.json (seeded random weights, run.build), `torch2jax.convert_hf(model,
max_cache_len=48, max_batch=2)` (max_source_len=16 for an encoder-decoder; a vision-language model's cache grows to
hold its check's image tokens), then hf/verify's check of its task (two prompts, one padded: a causal LM's on the
left, an encoder-decoder's sources on the right; a vision-language model's with an image each), 12 greedy tokens
each, no end token; then the artifact saved, loaded and checked again. Each row runs in its own process with a time
limit and is written to generation_results.json as it finishes (resumable).
docs/models.md's generation section is rendered from it (report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from . import run

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "generation_results.json"
TIMEOUT_S = 300
TOKENS = 12
MAX_CACHE_LEN = 48
MAX_SOURCE_LEN = 16  # an encoder-decoder's sources (the check's are 7 and 4 tokens)

OK = "ok"
BUILD = "model build fails"
REFERENCE = "transformers generate fails"  # no reference: no one's failure
REFUSED = "refused"  # a clear error of ours naming what does not generate yet
CONVERT = "fails in conversion"
MISMATCH = "mismatch"
MISMATCH_AFTER_LOAD = "mismatch after load"
SAVE_LOAD = "fails at save or load"
TIMEOUT = "timeout"
STATUSES = [OK, MISMATCH, MISMATCH_AFTER_LOAD, REFUSED, CONVERT, SAVE_LOAD, TIMEOUT, REFERENCE, BUILD]
NOT_RUN = {BUILD, REFERENCE}

# task -> the auto mapping of its classes
MAPPINGS = {
    "text-generation": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "text2text-generation": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "image-text-to-text": "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
}


def generation_rows(configs: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(model_type, class name, task) for every recorded model type a generating auto mapping lists."""
    import transformers
    from transformers.models.auto import modeling_auto

    exported = set(dir(transformers))
    rows = []
    for task, mapping in MAPPINGS.items():
        for model_type, names in getattr(modeling_auto, mapping).items():
            name = run._first(names)
            if model_type in configs and name in exported:
                rows.append((model_type, name, task))
    return sorted(set(rows), key=lambda r: run._spread(f"{r[0]}:{r[1]}"))


def generation_key(model_type: str, class_name: str, task: str) -> str:
    """A row's key: a class may generate under two tasks (GOT-OCR2's, T5Gemma2's), each its own row."""
    return f"{model_type}:{class_name}:{task}"


def _with_cache(model: Any) -> Any:
    """run.build turns the cache off (the forward sweep compares outputs without one); generation needs it."""
    config = model.config
    for sub in [config] + [getattr(config, k) for k in ("text_config", "decoder", "language_config") if hasattr(config, k)]:
        if hasattr(sub, "use_cache"):
            sub.use_cache = True
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.use_cache = True
    return model


def _from_transformers_generate(err: BaseException) -> bool:
    """Whether the error came from inside transformers' own generate (the reference), not from the artifact."""
    frames = traceback.extract_tb(err.__traceback__)
    inside = [f.filename for f in frames]
    return any("transformers/generation/" in name for name in inside) and not any(
        "torch2jax/generate/" in name for name in inside[-3:])


def _reference_failure(model: Any, task: str) -> str | None:
    """Why transformers' own greedy generate fails on a causal LM (its tester config may be inconsistent: a cache
    sized from a layer count the model does not use, experts fewer than their groups), or None when it runs. A row
    whose reference fails is no one's failure, whatever the conversion did."""
    if task != "text-generation":
        return None
    import torch

    embeddings = model.get_input_embeddings()
    rows = len(embeddings) if isinstance(embeddings, torch.nn.ModuleList) else 1  # MusicGen: a row per codebook
    try:
        with torch.no_grad():
            model.generate(torch.tensor([[1, 2, 3]] * rows), attention_mask=torch.ones(rows, 3, dtype=torch.long),
                           max_new_tokens=2, do_sample=False)
    except Exception as err:  # noqa: BLE001 - any failure of the reference
        return f"{run._first_line(err)} (the conversion failed too)"
    return None


def _advice(message: str, task: str, options: dict) -> tuple[str, dict] | None:
    """(task, options) that a refusal's own advice names: a smaller --max-cache-len / --max-source-len, or
    --task text-generation for a model that is not an encoder-decoder; None when it names none."""
    import re

    limit = re.search(r"pass (--max-cache-len|--max-source-len) (\d+) or less", message)
    if limit:
        name = "max_cache_len" if limit.group(1) == "--max-cache-len" else "max_source_len"
        return task, {**options, name: int(limit.group(2))}
    if "convert it with --task text-generation" in message and task != "text-generation":
        return "text-generation", {k: v for k, v in options.items() if k != "max_source_len"}
    return None


def _check(model: Any, generator: Any, task: str):
    from torch2jax.hf.verify import verify_generation, verify_seq2seq, verify_vision_language

    verify = {"text-generation": verify_generation, "text2text-generation": verify_seq2seq,
              "image-text-to-text": verify_vision_language}[task]
    return verify(model, generator, tokens=TOKENS)


def run_row(model_type: str, class_name: str, task: str, partial: Path | None = None) -> dict[str, Any]:
    """One row in this process; `partial` is rewritten as it goes, so a parent that kills the process keeps it."""
    import torch2jax
    from torch2jax.errors import ExportError, InputSpecError

    row: dict[str, Any] = {"model_type": model_type, "class": class_name, "task": task}

    def done(**more: Any) -> dict[str, Any]:
        row.update(more)
        if partial is not None:
            run._write_atomic(partial, row)
        return row

    entry = run.load_configs()[model_type]
    if entry.get("config") is None:
        return done(status=BUILD, error=entry.get("note", "no config recorded"))
    try:
        model = _with_cache(run.build(entry, class_name))
    except Exception as err:
        return done(status=BUILD, error=run._first_line(err))
    start = time.perf_counter()
    options = {"max_cache_len": MAX_CACHE_LEN, "max_batch": 2}
    if task == "text2text-generation":
        options["max_source_len"] = MAX_SOURCE_LEN
    for attempt in range(3):  # a refusal that names the fix is followed, as a user would
        try:
            generator = torch2jax.convert_hf(model, task=task, **options)
            break
        except (ExportError, InputSpecError) as err:
            if "Build it with is_decoder=True" in str(err) and attempt < 2:  # a BERT-like LM head built as an encoder
                model = _with_cache(run.build(entry, class_name, is_decoder=True))
                row.setdefault("followed", []).append(run._first_line(err)[:120])
                continue
            if "set config.decoder_start_token_id" in str(err) and attempt < 2:  # EncoderDecoderModel's own config
                model.config.decoder_start_token_id = model.generation_config.decoder_start_token_id = 1
                row.setdefault("followed", []).append(run._first_line(err)[:120])
                continue
            advice = _advice(str(err), task, options)
            if advice is None or attempt == 2:
                failure = _reference_failure(model, task)
                if failure is not None:
                    return done(status=REFERENCE, error=failure)
                return done(status=REFUSED, error=run._first_line(err))
            task, options = advice
            row.setdefault("followed", []).append(run._first_line(err)[:120])
        except Exception as err:  # noqa: BLE001 - the sweep records every failure
            trace = traceback.format_exc()[-800:]
            failure = _reference_failure(model, task)
            if failure is not None:
                return done(status=REFERENCE, error=failure)
            return done(status=CONVERT, error=run._first_line(err), trace=trace)
    vision = getattr(generator, "vision", None)
    if vision is not None:  # the cache holds the check's image tokens besides its text and new tokens
        from torch2jax.hf.verify import IMAGE_CHECK_TEXT, image_tokens

        needed = image_tokens(vision) + max(IMAGE_CHECK_TEXT) + TOKENS
        if needed > options["max_cache_len"]:
            options["max_cache_len"] = needed
            row["max_cache_len"] = needed
            generator = torch2jax.convert_hf(model, task=task, **options)
    row["task_run"] = task
    row["convert_seconds"] = round(time.perf_counter() - start, 1)
    for stage, subject in (("before", generator), ("after", None)):
        if subject is None:
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    subject = torch2jax.load(torch2jax.save(generator, Path(tmp) / "artifact"))
            except Exception as err:  # noqa: BLE001
                return done(status=SAVE_LOAD, error=run._first_line(err))
        try:
            result = _check(model, subject, task)  # (the task followed, when a refusal named another)
        except Exception as err:  # noqa: BLE001
            if _from_transformers_generate(err):
                return done(status=REFERENCE, error=run._first_line(err))
            return done(status=CONVERT, error=f"generate: {run._first_line(err)}", trace=traceback.format_exc()[-800:])
        rows = [{"ours": ours, "transformers": theirs} for ours, theirs in result.rows]
        if not result.ok:
            first = min(next((i for i, (a, b) in enumerate(zip(r["ours"], r["transformers"])) if a != b), len(r["ours"]))
                        for r in rows)
            return done(status=MISMATCH if stage == "before" else MISMATCH_AFTER_LOAD, tokens=rows,
                        error=f"greedy tokens part from transformers' at new token {first + 1}")
        done(tokens=rows, distinct=len({t for r in rows for t in r["transformers"]}))
    return done(status=OK, error=None)


def _row_process(model_type: str, class_name: str, task: str, partial: str, log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    run_row(model_type, class_name, task, Path(partial))


def run_in_subprocess(model_type: str, class_name: str, task: str, timeout_s: float) -> dict[str, Any]:
    """One row in its own process (forked from a server that imported the libraries), killed after timeout_s."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "transformers", "jax", "torch2jax"])
    with tempfile.TemporaryDirectory() as tmp:
        partial, log = Path(tmp) / "row.json", Path(tmp) / "row.log"
        start = time.perf_counter()
        process = context.Process(target=_row_process, args=(model_type, class_name, task, str(partial), str(log)))
        process.start()
        process.join(timeout_s)
        timed_out = process.is_alive()
        if timed_out:
            process.kill()
            process.join()
        row = json.loads(partial.read_text()) if partial.exists() else {}
        row.update(model_type=model_type, **{"class": class_name}, task=task)
        row["wall_seconds"] = round(time.perf_counter() - start, 1)
        if timed_out and row.get("status") is None:
            row.update(status=TIMEOUT, error=f"no result within {timeout_s:.0f} s")
        elif row.get("status") is None:
            last = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            row.update(status=CONVERT, error=f"process exit {process.exitcode}: {last}"[:300])
        return row


def load_results(path: Path = RESULTS) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {"rows": {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="model types to run")
    parser.add_argument("--shard", default="0/1", help="I/N: every N-th row starting at I")
    parser.add_argument("--limit", type=int, default=None, help="at most this many new rows")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per row")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--rerun", action="store_true", help="run rows already in the results again")
    parser.add_argument("--rerun-failed", action="store_true", help="run again the rows that did not pass")
    ns = parser.parse_args()
    import transformers

    index, count = (int(x) for x in ns.shard.split("/"))
    rows = [r for i, r in enumerate(generation_rows(run.load_configs())) if i % count == index]
    if ns.only:
        rows = [r for r in rows if r[0] in ns.only]
    results = load_results(ns.results)
    results["transformers"] = transformers.__version__

    def wanted(key: str) -> bool:
        old = results["rows"].get(key)
        return ns.rerun or old is None or (ns.rerun_failed and old["status"] != OK)

    todo = [r for r in rows if wanted(generation_key(*r))]
    if ns.limit is not None:
        todo = todo[: ns.limit]
    print(f"{len(todo)} rows to run ({len(results['rows'])} in {ns.results.name})", flush=True)
    for n, (model_type, class_name, task) in enumerate(todo, 1):
        row = run_in_subprocess(model_type, class_name, task, ns.timeout)
        row["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        results["rows"][generation_key(model_type, class_name, task)] = row
        run._write_atomic(ns.results, results)
        print(f"[{n}/{len(todo)}] {model_type} {class_name}: {row['status']} ({row.get('error') or ''})"[:220]
              + f" | {row['wall_seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
