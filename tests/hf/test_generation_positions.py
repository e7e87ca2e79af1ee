"""Greedy generation on a left-padded batch against transformers' own generate (same random weights, tiny configs)
for the causal LMs whose decoders count positions from the cache's length, not from position_ids (BART and kin:
hf/stand_ins/positions.py), and for JetMoE, whose attention experts tie on the pad id's zero embedding
(hf/stand_ins/experts.py).

Prompts of 9 and 5 tokens: the generator left-pads them to a 16-token length bucket, so 7 slots of bucket padding
come before the batch's own (4 slots in the shorter row). transformers counts the batch's own padding in these
decoders' positions but knows nothing of the bucket's; before the step gave the decoders their batch columns the
tokens differed from the first new one on.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.generate.generator import left_pad
from torch2jax.generate.loop import MIN_BUCKET
from torch2jax.hf.verify import transformers_greedy

VOCAB, PAD, BOS, EOS = 96, 0, 1, 2
LENGTHS, NEW, CACHE = (9, 5), 12, 48
# init_std 0.3 (transformers' 0.02 makes a tiny decoder repeat one token, which would hide a wrong position)
_STD = 0.3


def _seq2seq_config(cls, **extra):
    return cls(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
               pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=EOS, init_std=_STD, **extra)


def _build(name: str) -> torch.nn.Module:
    import transformers as tf

    causal = {  # the ...ForCausalLM built from its encoder-decoder config (the decoder alone)
        "bart": (tf.BartForCausalLM, tf.BartConfig), "mbart": (tf.MBartForCausalLM, tf.MBartConfig),
        "plbart": (tf.PLBartForCausalLM, tf.PLBartConfig), "pegasus": (tf.PegasusForCausalLM, tf.PegasusConfig),
        "blenderbot": (tf.BlenderbotForCausalLM, tf.BlenderbotConfig),
        "blenderbot_small": (tf.BlenderbotSmallForCausalLM, tf.BlenderbotSmallConfig),
        "marian": (tf.MarianForCausalLM, tf.MarianConfig), "mvp": (tf.MvpForCausalLM, tf.MvpConfig),
    }
    if name in causal:
        model, config = causal[name]
        return model(_seq2seq_config(config))
    if name == "bigbird_pegasus":
        return tf.BigBirdPegasusForCausalLM(_seq2seq_config(tf.BigBirdPegasusConfig, attention_type="original_full"))
    if name in ("trocr", "trocr_sinusoidal"):
        return tf.TrOCRForCausalLM(tf.TrOCRConfig(
            vocab_size=VOCAB, d_model=32, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=64,
            max_position_embeddings=64, init_std=_STD, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
            use_learned_position_embeddings=name == "trocr"))
    if name == "whisper":  # its causal LM's forward names no position_ids: transformers' generate passes none
        return tf.WhisperForCausalLM(tf.WhisperConfig(
            vocab_size=VOCAB, d_model=32, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=64,
            encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, max_target_positions=64,
            max_source_positions=32, num_mel_bins=8, init_std=_STD, pad_token_id=PAD, bos_token_id=BOS,
            eos_token_id=EOS, decoder_start_token_id=BOS, begin_suppress_tokens=None, suppress_tokens=None))
    if name == "xglm":  # takes position_ids (transformers' generate passes them): the control
        return tf.XGLMForCausalLM(tf.XGLMConfig(vocab_size=VOCAB, d_model=32, num_layers=2, attention_heads=4, ffn_dim=64,
                                                max_position_embeddings=64, init_std=_STD, pad_token_id=PAD,
                                                bos_token_id=BOS, eos_token_id=EOS))
    if name == "jetmoe":  # transformers' tester config, larger weights
        return tf.JetMoeForCausalLM(tf.JetMoeConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_key_value_heads=2, kv_channels=8,
            intermediate_size=37, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
            initializer_range=_STD, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS))
    raise KeyError(name)


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return _build(name).eval()  # BART and kin force their end token as the last new token: the generator does too


def padded_batch(pad_inside: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    rows = [rng.integers(3, VOCAB, n) for n in LENGTHS]
    if pad_inside:  # the pad id as a real token of the shorter prompt (its embedding row is zero)
        rows[1][2] = PAD
    ids, mask = left_pad(rows, PAD)
    assert MIN_BUCKET > ids.shape[1] and (~mask).sum(1).tolist() == [0, LENGTHS[0] - LENGTHS[1]]
    return ids, mask


def check(lm: torch.nn.Module, generate, pad_inside: bool = False, shift_shows: bool = False) -> None:
    """`generate`'s tokens equal transformers'; `shift_shows`: transformers' own tokens with the bucket's padding
    counted (what the step gave before) differ from them, so this comparison tells the two apart."""
    ids, mask = padded_batch(pad_inside)
    want = transformers_greedy(lm, ids, NEW, PAD, mask)
    got = generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[])
    assert got.shape == want.shape == (2, ids.shape[1] + NEW)
    np.testing.assert_array_equal(got, want)
    if shift_shows:
        extra = MIN_BUCKET - ids.shape[1]
        shifted = transformers_greedy(lm, np.pad(ids, ((0, 0), (extra, 0))), NEW, PAD, np.pad(mask, ((0, 0), (extra, 0))))
        assert (shifted[:, MIN_BUCKET:] != want[:, ids.shape[1]:]).any()


COUNTED_FROM_CACHE = ["bart", "mbart", "plbart", "pegasus", "blenderbot", "blenderbot_small", "marian", "mvp",
                      "bigbird_pegasus", "trocr", "trocr_sinusoidal", "whisper"]


@pytest.fixture(scope="module")
def converted():
    """name -> (the transformers model, its generator), converted once per module."""
    done: dict = {}

    def get(name: str):
        if name not in done:
            lm = build(name)
            done[name] = lm, torch2jax.convert_hf(lm, task="text-generation", max_cache_len=CACHE, max_batch=2)
        return done[name]

    return get


# BART's copies (the same decoder code, the same stand-in) run with the slow tests; each distinct positions module
# (BART's learned, Marian's sinusoidal, TrOCR's both, MVP, XGLM) runs by default
BART_COPIES = {"mbart", "plbart", "pegasus", "blenderbot", "blenderbot_small", "bigbird_pegasus"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if name in BART_COPIES else [])
                                  for name in [*COUNTED_FROM_CACHE, "xglm"]])
def test_left_padded_batch_equals_transformers_generate(name, converted):
    lm, g = converted(name)
    check(lm, g.generate, shift_shows=name in COUNTED_FROM_CACHE)


def test_positions_survive_save_and_load(tmp_path, converted):
    lm, g = converted("bart")
    assert lm.generation_config.forced_eos_token_id == g.spec.settings.forced_eos_token_id == EOS
    loaded = torch2jax.load(torch2jax.save(g, tmp_path / "bart"))
    check(lm, loaded.generate, shift_shows=True)


def test_jetmoe_pad_id_as_a_token_routes_as_torch_does(converted):
    """The pad id's embedding is zero, so JetMoE's attention router scores every expert 0 there: top-k then picks
    what torch's kernel picks among ties (XLA's picks others, and every token after it differed)."""
    lm, g = converted("jetmoe")
    with torch.no_grad():
        assert not lm.get_input_embeddings()(torch.tensor([PAD])).any()
    check(lm, g.generate, pad_inside=True)
    check(lm, g.generate)


def test_mvp_encoder_decoder_counts_decoder_positions_from_its_slots():
    """The encoder-decoder's decoder starts at position 0 with no padding before it, so its slots are its positions
    (BART, mBART, Marian, Pegasus, Blenderbot, PLBART measured equal to transformers as they were); MVP's own count,
    an arange from the cache's tensor length, stopped its conversion until the decode step gave it the slots."""
    import transformers as tf

    torch.manual_seed(0)
    lm = tf.MvpForConditionalGeneration(_seq2seq_config(tf.MvpConfig)).eval()
    lm.generation_config.forced_eos_token_id = None
    g = torch2jax.convert_hf(lm, task="text2text-generation", max_cache_len=16, max_batch=2, max_source_len=16)
    ids, mask = padded_batch()
    ids, mask = ids[:, ::-1].copy(), mask[:, ::-1].astype(np.int64)  # rows reversed: right-padded, as sources are
    with torch.no_grad():
        want = lm.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW,
                           do_sample=False, pad_token_id=PAD, eos_token_id=None).numpy()
    np.testing.assert_array_equal(g.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[]), want)


@pytest.mark.parametrize("name", ["bart", "marian", "trocr_sinusoidal"])
def test_served_rows_number_their_positions_as_each_request_alone(name, converted):
    """In the server's batch every row writes its own slots from 0, so these decoders take each row's own positions:
    requests of different lengths, joining while others run, each get generate's tokens for their prompt alone (the
    server applies no forced end token: generate's tokens before its forced last one)."""
    from torch2jax.serve.engine import BatchEngine
    from torch2jax.serve.scheduler import Request, Scheduler

    from ..serve.test_scheduler import run

    _, g = converted(name)
    scheduler = Scheduler(BatchEngine(g, 2, chunk=16), max_queue=4)
    rng = np.random.default_rng(1)
    load = [Request(rng.integers(3, VOCAB, n).tolist(), NEW, lambda e: None, end_tokens=()) for n in (9, 3, 14)]
    run(scheduler, {0: load[:1], 2: load[1:2], 5: load[2:]})
    for request in load:
        alone = g.generate(np.asarray([request.prompt]), max_new_tokens=NEW + 1, eos_token_id=[])  # forced end: last
        assert request.tokens == alone[0, len(request.prompt):-1].tolist(), len(request.prompt)


def test_a_bert_like_head_built_as_an_encoder_is_refused_and_generates_once_built_as_a_decoder():
    """RobertaForCausalLM with is_decoder=False (transformers' default for its config) attends both ways and keeps no
    cache: transformers' generate recomputes the whole text at each token, which a cached step cannot give, so the
    conversion refuses it naming the fix; built with is_decoder=True it generates transformers' tokens."""
    import transformers as tf

    def roberta(is_decoder: bool) -> torch.nn.Module:
        torch.manual_seed(0)
        config = tf.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, pad_token_id=PAD, bos_token_id=BOS,
                                  eos_token_id=EOS, initializer_range=_STD, is_decoder=is_decoder)
        return tf.RobertaForCausalLM(config).eval()

    encoder, decoder = roberta(False), roberta(True)
    ids, mask = padded_batch()
    # the same weights answer otherwise as an encoder: a cached decoder's tokens would be silently wrong for it
    assert (transformers_greedy(encoder, ids, NEW, PAD, mask) != transformers_greedy(decoder, ids, NEW, PAD, mask)).any()
    with pytest.raises(torch2jax.ExportError, match="is_decoder=False.*Build it with is_decoder=True"):
        torch2jax.convert_hf(encoder, task="text-generation", max_cache_len=CACHE, max_batch=2)
    check(decoder, torch2jax.convert_hf(decoder, task="text-generation", max_cache_len=CACHE, max_batch=2).generate)


def test_a_decoder_of_several_token_streams_per_row_is_refused_naming_them():
    """MusicGen's decoder reads input_ids of batch * codebooks rows through one embedding table per codebook; a
    text-generation artifact's row is one stream, so the conversion refuses it instead of tracing a wrong step."""
    import transformers as tf

    config = tf.MusicgenDecoderConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      ffn_dim=64, num_codebooks=3, max_position_embeddings=64)
    decoder = tf.MusicgenForCausalLM(config).eval()
    with pytest.raises(torch2jax.ExportError, match="MusicgenForCausalLM embeds 3 token streams per row"):
        torch2jax.convert_hf(decoder, task="text-generation", max_cache_len=CACHE, max_batch=2)


def test_a_model_without_a_language_model_head_is_refused_naming_its_generating_class():
    """LlamaModel (the base model: hidden states, no token logits) asked to generate is refused with the reason, not an
    AttributeError from deep inside the conversion."""
    import transformers as tf

    config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    with pytest.raises(torch2jax.ExportError, match="LlamaModel has no language-model head.*ForCausalLM"):
        torch2jax.convert_hf(tf.LlamaModel(config).eval(), task="text-generation", max_cache_len=CACHE, max_batch=2)


def _gemma3n(layers: int, shared: int) -> torch.nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    config = tf.Gemma3nTextConfig(
        vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=32, hidden_size_per_layer_input=8,
        intermediate_size=[48] * layers, num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, layer_types=["sliding_attention", "full_attention"] * (layers // 2), sliding_window=6,
        num_kv_shared_layers=shared, laurel_rank=8, activation_sparsity_pattern=[0.0] * layers, initializer_range=_STD,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, max_position_embeddings=64)
    return tf.Gemma3nForCausalLM(config).eval()


@pytest.mark.slow  # ~80 s on 2 cores (Gemma 3n's altup and laurel blocks); the sweep's gemma3n_text row runs it too
def test_gemma3n_layers_that_reuse_earlier_keys_generate_as_transformers(tmp_path):
    """Gemma 3n's last layers keep no cache (transformers' DummyLayer): they attend over the keys and values the last
    layer of their type wrote in the same step. Their cache entries are empty (no heads), the layers' numbering kept."""
    lm = _gemma3n(layers=4, shared=2)
    g = torch2jax.convert_hf(lm, task="text-generation", max_cache_len=CACHE, max_batch=2)
    assert [shape[0] for shape in g.spec.cache_shapes[::2]] == [1, 1, 0, 0]  # kv heads of each layer's keys
    check(lm, g.generate)
    check(lm, torch2jax.load(torch2jax.save(g, tmp_path / "gemma3n")).generate)
