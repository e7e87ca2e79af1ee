"""`torch2jax generate`: text (or token ids) from a text-generation or text2text-generation artifact, torch-free."""

from __future__ import annotations

import time

import click

from .common import handles_errors


@click.command()
@click.argument("artifact_dir", type=click.Path(file_okay=False))
@click.option("--prompt", "prompts", multiple=True, help="Prompt text (repeatable: a batch); needs the model's tokenizer.")
@click.option("--ids", "id_lists", multiple=True, help="Prompt token ids, comma-separated (repeatable: a batch), e.g. 1,450,7483.")
@click.option("--image", "images", multiple=True, type=click.Path(dir_okay=False, exists=True),
              help="image-text-to-text: a PNG/JPEG for the prompt (repeatable: several images, in order; one user "
                   "turn: the images, then --prompt).")
@click.option("--max-new-tokens", default=32, show_default=True)
@click.option("--temperature", type=float, help="Sample with this temperature (default: greedy decoding).")
@click.option("--top-k", type=int, help="Sample from the k most likely tokens.")
@click.option("--top-p", type=float, help="Sample from the smallest set of tokens whose probability reaches p.")
@click.option("--seed", default=0, show_default=True, help="PRNG seed for sampling.")
@click.option("--from-graph", is_flag=True, help="Rebuild the functions from their graphs instead of the StableHLO.")
@handles_errors
def generate(artifact_dir, prompts, id_lists, images, max_new_tokens, temperature, top_k, top_p, seed, from_graph):
    """Generate text (or token ids) with a text-generation or text2text-generation artifact; needs no torch.

    A causal LM continues each prompt (printed with it); an encoder-decoder reads each prompt as its source
    and prints the decoder's output, from its start token.

    \b
    Example:
      torch2jax generate out/llm --prompt "The capital of France is" --max-new-tokens 32
      torch2jax generate out/llm --ids 1,450,7483 --temperature 0.8 --top-p 0.9 --seed 0
      torch2jax generate out/t5 --prompt "translate English to German: Hello" --max-new-tokens 32
      torch2jax generate out/vlm --image cat.png --prompt "What is in the picture?" --max-new-tokens 32
      torch2jax generate out/vlm --image a.png --image b.png --prompt "What differs?"

    With --image (an image-text-to-text artifact) the prompt is built as the model's processor builds one user
    turn (chat template, each image's tokens, the generation prompt) and the reply is printed.
    """

    import torch2jax
    from torch2jax.errors import InputSpecError
    from torch2jax.generate.generator import left_pad
    from torch2jax.generate.seq2seq import right_pad

    if bool(prompts) == bool(id_lists):
        raise InputSpecError("give the prompt as --prompt TEXT or as --ids 1,2,3 (one of them, repeatable for a batch)")
    g = torch2jax.load(artifact_dir, from_graph=from_graph)
    if not isinstance(g, (torch2jax.Generator, torch2jax.Seq2SeqGenerator)):
        raise InputSpecError(f"{artifact_dir} is not a text-generation artifact (convert hf:DIR --task text-generation, "
                             "or --task text2text-generation for an encoder-decoder)")
    sampling = {k: v for k, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)) if v is not None}
    options = {}
    if sampling:
        import jax

        options = {"do_sample": True, "rng": jax.random.key(seed), **sampling}
    if images or isinstance(g, torch2jax.VisionLanguageGenerator):
        if images and not isinstance(g, torch2jax.VisionLanguageGenerator):
            raise InputSpecError(f"{artifact_dir} is a {g.TASK} artifact: --image needs an image-text-to-text artifact "
                                 "(convert hf:DIR --task image-text-to-text)")
        if images:
            if len(prompts) != 1:
                raise InputSpecError("--image takes one --prompt (the images and one prompt make one user turn)")
            ids, pixels, *grid = g.processor_inputs(prompts[0], list(images))
            if grid:  # Qwen2-VL: each image's patch grid; LLaVA-NeXT: each image's size (OneVision: and the image count)
                options["image_sizes" if g.vision.grid_pinpoints else "image_grid_thw"] = grid[0]
                if len(grid) > 1:
                    options["batch_num_images"] = grid[1]
            start = time.perf_counter()
            out = g.generate(ids, pixel_values=pixels, max_new_tokens=max_new_tokens, **options)
            elapsed = time.perf_counter() - start
            new = [int(t) for t in out[0, ids.shape[1]:]]
            click.echo(g.tokenizer.decode(new, skip_special_tokens=True))
            click.echo(f"{len(new)} new tokens in {elapsed:.2f}s (first call includes compilation)", err=True)
            return
    seq2seq = isinstance(g, torch2jax.Seq2SeqGenerator)
    if seq2seq and g.spec.takes_features:
        raise InputSpecError(f"{artifact_dir} reads audio features (input_features), not token ids: call "
                             "torch2jax.load(...).generate(input_features=...) in Python")
    tokenizer = None
    if prompts:
        if "tokenizer.json" not in g.tokenizer_files:
            raise InputSpecError(f"{artifact_dir} has no tokenizer (its model directory had no tokenizer.json): "
                                 "pass token ids with --ids 1,450,7483 instead")
        tokenizer = g.tokenizer
        rows = [tokenizer.encode(text).ids for text in prompts]
    else:
        try:
            rows = [[int(t) for t in text.split(",") if t.strip()] for text in id_lists]
        except ValueError:
            raise InputSpecError(f"--ids takes comma-separated integers, got {list(id_lists)}") from None
    if any(not row for row in rows):
        raise InputSpecError("a prompt has no tokens")
    ids, mask = (right_pad if seq2seq else left_pad)(rows, g.spec.pad_token_id)
    width = 1 if seq2seq else ids.shape[1]  # where the new tokens start: after the start token, or the prompt
    start = time.perf_counter()
    out = g.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, **options)
    elapsed = time.perf_counter() - start
    for r, row in enumerate(rows):
        new = [int(t) for t in out[r, width:]]
        ended = next((i for i, t in enumerate(new) if t in g.spec.eos_token_ids), None)
        new = new if ended is None else new[: ended + 1]
        shown = [int(out[r, 0]), *new] if seq2seq else row + new
        click.echo(tokenizer.decode(shown) if tokenizer is not None else ",".join(map(str, shown)))
    click.echo(f"{out.shape[1] - width} new tokens x {len(rows)} rows in {elapsed:.2f}s (first call includes compilation)", err=True)
