"""`torch2jax finetune hf:DIR`: the CLI contract end to end. Trajectories equal PEFT + torch.optim's from the same
initial adapter (SGD and AdamW), full fine-tuning equals torch's, 3 steps then 3 resumed equal 6, the adapter and the
merged directory load in PEFT / transformers with our logits, and bad input leaves no output directory."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import peft
import pytest
import torch
import transformers
from click.testing import CliRunner
from safetensors.numpy import load_file
from tokenizers import Tokenizer
from torch2jax.cli.main import main

from tests.finetune.cases import peft_model
from tests.generate.lms import EOS, PAD, write_lm, write_tokenizer
from tests.helpers import cli
from torch2jax.finetune import data as finetune_data
from torch2jax.finetune import load_adapter, make_batch, merge
from torch2jax.hf.training import training_forward

BATCH, LENGTH = 3, 12


def write_data(path: Path, count: int = 7) -> Path:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(count):
        words = " ".join(f"w{t}" for t in rng.integers(3, 128, int(rng.integers(3, 11))))
        record = {"text": words} if i % 2 else {"prompt": "w5 w6 w7", "completion": words}
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("finetune")
    for name in ("llama", "gpt2"):
        write_tokenizer(write_lm(name, root))
    write_data(root / "train.jsonl")
    return root


def run_cli(*args: str) -> object:
    return CliRunner().invoke(main, ["finetune", *args], catch_exceptions=False)


def finetune_args(workdir: Path, model: str, out: Path, *extra: str) -> list[str]:
    return [f"hf:{workdir / model}", "--data", str(workdir / "train.jsonl"), "--out", str(out), "--batch-size", str(BATCH),
            "--max-length", str(LENGTH), "-q", *extra]


def losses(out: Path) -> list[float]:
    lines = [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, len(lines) + 1))
    return [line["loss"] for line in lines]


def batches(workdir: Path, steps: int, seed: int = 0, shuffle: bool = True) -> list[dict]:
    """The batches the run trains on, built as the documented rule says: tokenizer.json, the end token, the order."""
    tokenizer = Tokenizer.from_file(str(workdir / "llama" / "tokenizer.json"))
    rows = finetune_data.tokenize(finetune_data.read_examples(workdir / "train.jsonl"), tokenizer, EOS, LENGTH)
    return [make_batch([rows[i] for i in finetune_data.batch_indices(len(rows), BATCH, step, seed, shuffle)], LENGTH, PAD)
            for step in range(steps)]


def relative(ours, theirs) -> float:
    return float(np.linalg.norm(np.asarray(ours, np.float64) - theirs) / np.linalg.norm(theirs))


def torch_steps(model, optimizer, steps: list[dict]) -> list[float]:
    out = []
    for batch in steps:
        loss = model(**{k: torch.from_numpy(v.astype(np.int64)) for k, v in batch.items()}).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        out.append(loss.item())
    return out


def load_base(directory: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32).eval()


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_lora_trajectory_equals_peft_and_torch_optim(workdir, tmp_path, name):
    out = tmp_path / "run"
    lr = "0.05" if name == "sgd" else "0.01"
    result = run_cli(*finetune_args(workdir, "llama", out, "--lora-rank", "4", "--lora-alpha", "8",
                                    "--lora-targets", "q_proj,v_proj,o_proj", "--optimizer", name, "--lr", lr,
                                    "--steps", "4", "--save-init"))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["adapter", "adapter_init", "checkpoint", "finetune.json",
                                                     "losses.jsonl", "merged"]

    pm = peft_model(load_base(workdir / "llama"), out / "adapter_init", is_trainable=True).eval()
    trainable = [p for p in pm.parameters() if p.requires_grad]
    assert len(trainable) == 2 * 3 * 2  # A and B, three targets, two layers
    opt = torch.optim.SGD(trainable, lr=float(lr)) if name == "sgd" else torch.optim.AdamW(trainable, lr=float(lr))
    theirs = torch_steps(pm, opt, batches(workdir, 4))
    ours = losses(out)
    assert len(ours) == 4 and ours[-1] < ours[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)

    final = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    state = {k: v.detach().numpy() for k, v in peft.get_peft_model_state_dict(pm).items()}
    assert sorted(final) == sorted(state)
    for key, value in state.items():
        assert relative(final[key], value) < 1e-4, key


def test_adapter_and_merged_load_with_our_logits_and_resume_continues(workdir, tmp_path):
    """Through the real console script: a GPT-2 (Conv1D layers, default targets c_attn), 3 steps then 3 resumed."""
    six, three = tmp_path / "six", tmp_path / "three"
    common = ["--lr", "0.01", "--lora-rank", "4"]
    done = cli("finetune", *finetune_args(workdir, "gpt2", six, *common, "--steps", "6"))
    assert done.returncode == 0, done.stderr
    for args in (["--steps", "3"], ["--steps", "3", "--resume"]):
        step = cli("finetune", *finetune_args(workdir, "gpt2", three, *common, *args))
        assert step.returncode == 0, step.stderr
    assert losses(three) == losses(six)
    a, b = (load_file(str(d / "adapter" / "adapter_model.safetensors")) for d in (three, six))
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)

    adapter, config = load_adapter(six / "adapter")
    assert config.fan_in_fan_out and config.targets == ("c_attn",)
    model = training_forward(load_base(workdir / "gpt2"), BATCH, LENGTH)
    batch = batches(workdir, 1)[0]
    ours = np.asarray(model.apply(merge(model.params, adapter, config), batch["input_ids"],
                                  attention_mask=batch["attention_mask"])["logits"])
    inputs = {k: torch.from_numpy(batch[k].astype(np.int64)) for k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        through_peft = peft_model(load_base(workdir / "gpt2"), six / "adapter").eval()(**inputs).logits
        merged = load_base(six / "merged")(**inputs).logits
    real = batch["attention_mask"].astype(bool)
    for theirs in (through_peft, merged):
        np.testing.assert_allclose(ours[real], theirs.numpy()[real], rtol=1e-4, atol=1e-4)


def test_full_finetuning_equals_torch(workdir, tmp_path):
    out = tmp_path / "full"
    result = run_cli(*finetune_args(workdir, "llama", out, "--full", "--optimizer", "sgd", "--lr", "0.05", "--steps", "3"))
    assert result.exit_code == 0, result.output
    assert not (out / "adapter").exists()
    lm = load_base(workdir / "llama").eval()
    theirs = torch_steps(lm, torch.optim.SGD(lm.parameters(), lr=0.05), batches(workdir, 3))
    np.testing.assert_allclose(losses(out), theirs, rtol=1e-4)
    merged = load_file(str(out / "merged" / "model.safetensors"))
    expected = {k: v.detach().numpy() for k, v in lm.state_dict().items() if k in merged}
    assert sorted(expected) == sorted(merged)
    for key, value in expected.items():
        assert relative(merged[key], value) < 1e-4, key
    base = load_base(workdir / "llama").state_dict()
    assert all(not np.array_equal(merged[k], base[k].numpy()) for k in merged)  # every weight trained


def test_tokenizing_and_batch_order_follow_the_documented_rule(workdir):
    tokenizer = Tokenizer.from_file(str(workdir / "llama" / "tokenizer.json"))
    examples = [finetune_data.Example(1, "w7 w8", "w5 w6"), finetune_data.Example(2, "w9 w10 w11")]
    assert finetune_data.tokenize(examples, tokenizer, EOS, 8) == [([5, 6], [7, 8, EOS]), ([], [9, 10, 11, EOS])]
    batch = make_batch([([5, 6], [7, 8, EOS])], 6, PAD)
    assert batch["labels"].tolist() == [[-100, -100, 7, 8, EOS, -100]]
    for shuffle in (True, False):
        taken = [finetune_data.batch_indices(7, 3, step, 0, shuffle) for step in range(7)]
        flat = sum(taken, [])
        assert all(sorted(flat[e * 7:(e + 1) * 7]) == list(range(7)) for e in range(3))  # each epoch sees each once
        assert (flat[:7] == list(range(7))) != shuffle
    assert finetune_data.batch_indices(7, 3, 5, 1, True) != finetune_data.batch_indices(7, 3, 5, 2, True)


@pytest.mark.parametrize(("lines", "message"), [
    (['{"text": "w5 w6"', ], "line 1 is not JSON"),
    (['{"text": "w5 w6"}', '["w5"]'], "line 2 is a JSON list, not an object"),
    (['{"prompt": "w5", "answer": "w6"}'], "has the keys ['answer', 'prompt']"),
    (['{"text": 3}'], "'text' must be a string, got 3"),
    (['{"prompt": "w5", "completion": ""}'], "'completion' is empty"),
    (['', '  '], "holds no examples"),
    (['{"prompt": "w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17", "completion": "w3"}'], "raise --max-length"),
])
def test_bad_data_is_one_paragraph_and_writes_nothing(workdir, tmp_path, lines, message):
    data = tmp_path / "bad.jsonl"
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    args = finetune_args(workdir, "llama", out, "--lr", "0.01", "--steps", "1")
    args[args.index("--data") + 1] = str(data)
    result = run_cli(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not out.exists() and not list(tmp_path.glob(".out*"))


@pytest.mark.parametrize(("extra", "message"), [
    (["--full", "--lora-rank", "4"], "--full trains every weight, so --lora-rank do not apply"),
    (["--lora-targets", "q_proj,nope"], "--lora-targets ['nope'] match no linear layer"),
    (["--lora-rank", "0"], "--lora-rank must be an integer >= 1"),
    (["--lr", "0"], "--lr must be > 0"),
    (["--max-length", "1"], "--max-length must be >= 2"),
    (["--resume"], "nothing to resume"),
])
def test_bad_arguments_are_one_paragraph_and_write_nothing(workdir, tmp_path, extra, message):
    out = tmp_path / "out"
    args = finetune_args(workdir, "llama", out, "--steps", "1", *extra)
    if "--lr" not in extra:
        args += ["--lr", "0.01"]
    result = run_cli(*args)
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output and not out.exists()


def test_an_existing_output_or_other_settings_are_refused(workdir, tmp_path):
    out = tmp_path / "run"
    args = finetune_args(workdir, "llama", out, "--lr", "0.01", "--steps", "1")
    assert run_cli(*args).exit_code == 0
    before = (out / "losses.jsonl").read_text()
    again = run_cli(*args)
    assert again.exit_code == 1 and "already exists: pass --resume" in again.output
    other = run_cli(*finetune_args(workdir, "llama", out, "--lr", "0.02", "--steps", "1", "--resume"))
    assert other.exit_code == 1 and "lr: 0.02 now, 0.01 in the run" in other.output
    assert (out / "losses.jsonl").read_text() == before
    assert run_cli(*args, "--force").exit_code == 0


def test_a_diverging_run_names_the_step_and_writes_nothing(workdir, tmp_path):
    out = tmp_path / "run"
    result = run_cli(*finetune_args(workdir, "llama", out, "--full", "--optimizer", "sgd", "--lr", "1e30", "--steps", "3"))
    assert result.exit_code == 1 and "training diverged; lower --lr" in result.output, result.output
    assert not out.exists() and not list(tmp_path.glob(".run*"))



def test_a_vision_language_models_language_part(tmp_path):
    """LLaVA: the adapter goes on the language model's layers only (the CLIP tower has layers of the same names), the
    trajectory equals PEFT's on the text forward, and the merged directory is the whole model, its tower untouched."""
    from tests.hf.vlms import write

    source = write("llava", tmp_path)
    data = tmp_path / "train.jsonl"
    rng = np.random.default_rng(1)
    data.write_text("".join(json.dumps({"prompt": "w7 w8", "completion": " ".join(f"w{t}" for t in rng.integers(9, 128, 5))})
                            + "\n" for _ in range(6)))
    out = tmp_path / "run"
    result = run_cli(f"hf:{source}", "--data", str(data), "--out", str(out), "--batch-size", "2", "--max-length", "10",
                     "--lr", "0.01", "--steps", "3", "--save-init", "-q")
    assert result.exit_code == 0, result.output
    targets = json.loads((out / "adapter" / "adapter_config.json").read_text())["target_modules"]
    assert sorted(targets) == sorted(f"model.language_model.layers.{i}.self_attn.{p}" for i in (0, 1) for p in ("q_proj", "v_proj"))

    base = transformers.AutoModelForImageTextToText.from_pretrained(source, dtype=torch.float32).eval()
    pm = peft_model(base, out / "adapter_init", is_trainable=True).eval()
    trainable = [p for p in pm.parameters() if p.requires_grad]
    assert len(trainable) == 8
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    rows = finetune_data.tokenize(finetune_data.read_examples(data), tokenizer, 2, 10)
    steps = [make_batch([rows[i] for i in finetune_data.batch_indices(len(rows), 2, step, 0, True)], 10, 0) for step in range(3)]
    np.testing.assert_allclose(losses(out), torch_steps(pm, torch.optim.AdamW(trainable, lr=0.01), steps), rtol=1e-4)

    merged = transformers.AutoModelForImageTextToText.from_pretrained(out / "merged", dtype=torch.float32).state_dict()
    original = transformers.AutoModelForImageTextToText.from_pretrained(source, dtype=torch.float32).state_dict()
    tower = [k for k in merged if k.startswith("model.vision_tower.")]
    assert tower and all(torch.equal(merged[k], original[k]) for k in tower)
    language = [k for k in merged if k.startswith("model.language_model.") and k.endswith(("q_proj.weight", "v_proj.weight"))]
    assert len(language) == 4 and not any(torch.equal(merged[k], original[k]) for k in language)
    assert (source / "preprocessor_config.json").is_file() == (out / "merged" / "preprocessor_config.json").is_file()
