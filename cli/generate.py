"""`torch2jax generate`: text (or token ids) from a text-generation or text2text-generation artifact, torch-free."""

from __future__ import annotations

import time

import click

from .common import handles_errors, needs_extra


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
@click.option("--min-p", type=float, help="Sample only tokens at least this fraction as likely as the most likely one.")
@click.option("--typical-p", type=float, help="Typical sampling: keep this much probability mass, nearest the entropy.")
@click.option("--greedy", is_flag=True, help="Greedy decoding even where the model's generation config samples.")
@click.option("--repetition-penalty", type=float, help="Divide (multiply, if negative) the logits of tokens already seen "
              "by this; 1.0 is off.")
@click.option("--no-repeat-ngram-size", type=int, help="Never repeat an n-gram of this size (0 is off).")
@click.option("--min-new-tokens", type=int, help="No end token before this many new tokens.")
@click.option("--min-length", type=int, help="No end token before the sequence (prompt included) is this long.")
@click.option("--suppress-tokens", help="Token ids never generated, comma-separated.")
@click.option("--begin-suppress-tokens", help="Token ids not generated first, comma-separated.")
@click.option("--bad-words-ids", "bad_words", multiple=True, help="A token id sequence never generated, comma-separated "
              "(repeatable).")
@click.option("--num-beams", type=int, help="Beam search with this many beams per prompt, as transformers' (1: one "
              "sequence, greedy or sampled).")
@click.option("--length-penalty", type=float, help="Beam search: finished sequences score sum(log p) / length ** this "
              "(> 1 favors longer ones, < 1 shorter).")
@click.option("--num-return-sequences", type=int, help="Beam search: print each prompt's best this many sequences "
              "(at most --num-beams).")
@click.option("--prompt-lookup-num-tokens", type=int, help="Prompt-lookup decoding (causal LMs, greedy, one prompt): "
              "draft up to this many tokens by copying what followed an earlier occurrence of the last tokens, and verify "
              "them in one step; the output is plain greedy decoding's, sooner when the reply repeats the prompt.")
@click.option("--max-matching-ngram-size", type=int, help="Prompt lookup: the longest n-gram matched (default 2).")
@click.option("--seed", default=0, show_default=True, help="PRNG seed for sampling.")
@click.option("--from-graph", is_flag=True, help="Rebuild the functions from their graphs instead of the StableHLO.")
@handles_errors
def generate(artifact_dir, prompts, id_lists, images, max_new_tokens, temperature, top_k, top_p, min_p, typical_p, greedy,
             repetition_penalty, no_repeat_ngram_size, min_new_tokens, min_length, suppress_tokens, begin_suppress_tokens,
             bad_words, num_beams, length_penalty, num_return_sequences, prompt_lookup_num_tokens, max_matching_ngram_size, seed,
             from_graph):
    """Generate text (or token ids) with a text-generation or text2text-generation artifact; needs no torch.

    A causal LM continues each prompt (printed with it); an encoder-decoder reads each prompt as its source
    and prints the decoder's output, from its start token.

    \b
    Example:
      torch2jax generate out/llm --prompt "The capital of France is" --max-new-tokens 32
      torch2jax generate out/llm --ids 1,450,7483 --temperature 0.8 --top-p 0.9 --seed 0
      torch2jax generate out/t5 --prompt "translate English to German: Hello" --max-new-tokens 32
      torch2jax generate out/t5 --prompt "translate English to German: Hello" --num-beams 4 --num-return-sequences 2
      torch2jax generate out/vlm --image cat.png --prompt "What is in the picture?" --max-new-tokens 32
      torch2jax generate out/vlm --image a.png --image b.png --prompt "What differs?"

    With --image (an image-text-to-text artifact) the prompt is built as the model's processor builds one user
    turn (chat template, each image's tokens, the generation prompt) and the reply is printed. In Python:
    `torch2jax.load(DIR).generate_text(prompts, images=..., max_new_tokens=...)` returns what this prints.

    Settings not given come from the model's generation config (saved in the artifact), as with transformers: a
    model whose config samples samples (with --seed) unless --greedy; its repetition penalty, suppressed tokens and
    so on apply unless overridden here, e.g. --repetition-penalty 1.0 to turn its penalty off. A config that sets
    num_beams beam-searches (--num-beams 1 for one sequence per prompt); with --num-return-sequences each prompt's
    sequences are printed in turn, best first.
    """

    import torch2jax
    from torch2jax.errors import InputSpecError

    if bool(prompts) == bool(id_lists):
        raise InputSpecError("give the prompt as --prompt TEXT or as --ids 1,2,3 (one of them, repeatable for a batch)")
    if images:
        needs_extra("vision", "PIL", "tokenizers", "jinja2")
    elif prompts:
        needs_extra("text", "tokenizers")
    g = torch2jax.load(artifact_dir, from_graph=from_graph)
    if not isinstance(g, (torch2jax.Generator, torch2jax.Seq2SeqGenerator)):
        raise InputSpecError(f"{artifact_dir} is not a text-generation artifact (convert hf:DIR --task text-generation, "
                             "or --task text2text-generation for an encoder-decoder)")
    if images and not isinstance(g, torch2jax.VisionLanguageGenerator):
        raise InputSpecError(f"{artifact_dir} is a {g.TASK} artifact: --image needs an image-text-to-text artifact "
                             "(convert hf:DIR --task image-text-to-text)")
    if images and len(prompts) != 1:
        raise InputSpecError("--image takes one --prompt (the images and one prompt make one user turn)")
    if isinstance(g, torch2jax.Seq2SeqGenerator) and g.spec.takes_features:
        raise InputSpecError(f"{artifact_dir} reads audio features (input_features), not token ids: call "
                             "torch2jax.load(...).generate(input_features=...) in Python")
    if prompts and not images and "tokenizer.json" not in g.tokenizer_files:
        raise InputSpecError(f"{artifact_dir} has no tokenizer (its model directory had no tokenizer.json): "
                             "pass token ids with --ids 1,450,7483 instead")
    try:
        rows = list(prompts) or [[int(t) for t in text.split(",") if t.strip()] for text in id_lists]
    except ValueError:
        raise InputSpecError(f"--ids takes comma-separated integers, got {list(id_lists)}") from None
    import jax

    def token_ids(flag: str, text: str) -> list[int]:
        try:
            return [int(t) for t in text.split(",") if t.strip()]
        except ValueError:
            raise InputSpecError(f"{flag} takes comma-separated integers, got {text!r}") from None

    given = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "typical_p": typical_p,
             "repetition_penalty": repetition_penalty, "no_repeat_ngram_size": no_repeat_ngram_size,
             "min_new_tokens": min_new_tokens, "min_length": min_length,
             "suppress_tokens": None if suppress_tokens is None else token_ids("--suppress-tokens", suppress_tokens),
             "begin_suppress_tokens": None if begin_suppress_tokens is None else
             token_ids("--begin-suppress-tokens", begin_suppress_tokens),
             "bad_words_ids": [token_ids("--bad-words-ids", word) for word in bad_words] or None,
             "num_beams": num_beams, "length_penalty": length_penalty, "num_return_sequences": num_return_sequences,
             "prompt_lookup_num_tokens": prompt_lookup_num_tokens, "max_matching_ngram_size": max_matching_ngram_size}
    samples = any(given[k] is not None for k in ("temperature", "top_k", "top_p", "min_p", "typical_p"))
    if greedy and samples:
        raise InputSpecError("--greedy takes no sampling option (--temperature, --top-k, --top-p, --min-p, --typical-p)")
    options = {"rng": jax.random.key(seed), **{k: v for k, v in given.items() if v is not None}}
    if samples or greedy:
        options["do_sample"] = not greedy
    start = time.perf_counter()
    completions = g.complete(rows, images=list(images), max_new_tokens=max_new_tokens, **options)
    elapsed = time.perf_counter() - start
    for completion in completions:
        click.echo(completion.text if completion.text is not None else ",".join(map(str, completion.ids)))
    new = max(c.new_tokens for c in completions)
    rows_note = "" if images else f" x {len(completions)} rows"
    click.echo(f"{new} new tokens{rows_note} in {elapsed:.2f}s (first call includes compilation)", err=True)
