"""`torch2jax finetune`: LoRA or full fine-tuning of a Hugging Face causal LM in JAX, handed back as a PEFT adapter
and a merged Hugging Face directory."""

from __future__ import annotations

import click

from .common import Progress, handles_errors, needs_extra

BAR_WIDTH = 24


class StepBar:
    """The training steps as a bar redrawn in place on a terminal (loss, tokens/s); a log gets about 20 lines."""

    def __init__(self, progress: Progress, quiet: bool):
        self.progress, self.quiet = progress, quiet
        self.tty = click.get_text_stream("stderr").isatty()
        self.first: int | None = None

    def __call__(self, report) -> None:
        if self.first is None:
            self.progress.done()
            self.first = report.step
        if self.quiet:
            return
        total = report.last - self.first + 1
        done = report.step - self.first + 1
        filled = round(BAR_WIDTH * done / total)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        if done == 1:  # the first step compiles the training step
            speed = f"compiled in {report.seconds:.1f}s"
        else:
            speed = f"{report.tokens / max(report.seconds, 1e-9):,.0f} tokens/s"
        line = f"[train] step {report.step}/{report.last} [{bar}] loss {report.loss:.4f}  {speed}"
        if self.tty:
            click.echo(f"\r{line}", err=True, nl=report.step == report.last)
        elif report.step == report.last or done % max(1, total // 20) == 0 or done == 1:
            click.echo(line, err=True)


def _targets(text: str | None) -> list[str] | None:
    return None if text is None else [t.strip() for t in text.split(",")]


@click.command()
@click.argument("model")
@click.option("--data", required=True, type=click.Path(dir_okay=False),
              help='JSON lines: {"text": ...} (every token trained on) or {"prompt": ..., "completion": ...} (the '
                   "completion only).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Output directory: adapter/, merged/, losses.jsonl, checkpoint/.")
@click.option("--lora-rank", type=int, help="LoRA rank r [default: 8].")
@click.option("--lora-alpha", type=float, help="LoRA alpha; the update is scaled by alpha / r [default: 8].")
@click.option("--lora-targets", help="Comma-separated module-name suffixes to adapt, as PEFT's target_modules "
                                     "[default: the attention's query and value projections, e.g. q_proj,v_proj].")
@click.option("--full", is_flag=True, help="Train every weight instead of a LoRA adapter (writes merged/ only).")
@click.option("--optimizer", type=click.Choice(["sgd", "adamw"]), default="adamw", show_default=True,
              help="As torch.optim's: SGD without momentum; AdamW with betas (0.9, 0.999), eps 1e-8.")
@click.option("--lr", type=float, required=True, help="Learning rate, constant (no warm-up, no schedule).")
@click.option("--weight-decay", type=float, help="[default: torch's: 0 for sgd (L2 on the gradient), 0.01 for adamw "
                                                 "(decoupled)].")
@click.option("--steps", type=int, required=True, help="Optimizer steps this run takes (with --resume: more steps).")
@click.option("--batch-size", type=int, default=8, show_default=True, help="Examples per step.")
@click.option("--max-length", type=int, default=512, show_default=True, help="Tokens per example; longer ones are cut.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True,
              help="The forward's weights and compute; bfloat16 keeps the trained values (adapters, full fine-tuning's "
                   "master weights) in float32.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the LoRA init and the data order.")
@click.option("--no-shuffle", is_flag=True, help="Take the examples in file order.")
@click.option("--save-init", is_flag=True, help="Also write the adapter before the first step (OUT/adapter_init/).")
@click.option("--resume", is_flag=True, help="Go on from the run in --out (same settings): 3 steps then 3 resumed = 6.")
@click.option("--force", is_flag=True, help="Replace an existing --out instead of refusing.")
@click.option("--artifact", is_flag=True, help="Then convert OUT/merged to a text-generation artifact in OUT/artifact "
                                               "(torch2jax generate / serve / load it), verified against transformers.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@handles_errors
def finetune(model, data, out_dir, lora_rank, lora_alpha, lora_targets, full, optimizer, lr, weight_decay, steps,
             batch_size, max_length, dtype, seed, no_shuffle, save_init, resume, force, artifact, quiet):
    """Fine-tune a Hugging Face causal LM (hf:DIR) in JAX with LoRA (default) or --full, and hand it back.

    Writes OUT/adapter/ (LoRA, in PEFT's format: peft.PeftModel.from_pretrained loads it), OUT/merged/ (a Hugging
    Face directory: AutoModelForCausalLM.from_pretrained loads it; `torch2jax convert hf:OUT/merged` serves it),
    OUT/losses.jsonl ({"step", "loss"} per step) and OUT/checkpoint/ (Orbax, for --resume). Each text is closed with
    the model's end token; padding and prompts are not trained on. Dropout is off. Nothing is written to OUT when
    the data, the arguments or the training fail.

    \b
    Example:
      torch2jax finetune hf:models/llama --data train.jsonl --out runs/llama-lora \\
          --lora-rank 8 --lora-alpha 16 --lora-targets q_proj,v_proj \\
          --optimizer adamw --lr 1e-4 --steps 100 --batch-size 8 --max-length 256 --seed 0
      torch2jax finetune hf:models/llama --data train.jsonl --out runs/llama-lora --lr 1e-4 --steps 100 --resume
    """
    needs_extra("convert", "torch")
    needs_extra("text", "tokenizers")
    needs_extra("finetune", "optax", "safetensors")
    from torch2jax.hf.directory import PREFIX
    from torch2jax.hf.training import Method
    from torch2jax.pipeline.finetune import finetune as run_finetune

    if not model.startswith(PREFIX):
        from torch2jax.errors import InputSpecError

        raise InputSpecError(f"finetune takes a Hugging Face model directory as hf:DIR, got {model!r}")
    progress = Progress(quiet)
    method = Method(full=full, lora_rank=lora_rank, lora_alpha=lora_alpha, lora_targets=_targets(lora_targets))
    out = run_finetune(model, data, out_dir, steps=steps, lr=lr, method=method, optimizer=optimizer,
                       weight_decay=weight_decay, batch_size=batch_size, max_length=max_length, seed=seed,
                       shuffle=not no_shuffle, save_init=save_init, resume=resume, force=force, artifact=artifact, dtype=dtype,
                       progress=progress,
                       on_step=StepBar(progress, quiet))
    progress.done()
    if not quiet:
        click.echo(f"wrote {out}", err=True)
