"""TextStream over a byte-level tokenizer, whose multi-byte characters take several tokens: decoded incrementally
(tokenizers' DecodeStream), each character sent whole, stop strings held back, special tokens skipped; the same text,
chunk for chunk, as decoding the whole reply at every token (what it does for a tokenizer with only `decode`)."""

from __future__ import annotations

import pytest

from torch2jax.generate.text import INCOMPLETE, TextStream

TEXT = "héllo 日本語 wörld STOP ok"


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE trained on ASCII text only: every non-ASCII character is one token per UTF-8 byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=280, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<eos>"], show_progress=False)
    tokenizer.train_from_iterator(["hello world, stop it ok"], trainer)
    return tokenizer


class DecodeOnly:
    """The same tokenizer seen through `decode` alone, as a transformers tokenizer would be."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def decode(self, ids, skip_special_tokens=True):
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def pushed(stream: TextStream, ids: list[int]) -> list[tuple[str, bool]]:
    return [stream.push(t) for t in ids]


def test_characters_split_across_tokens_are_sent_whole(tokenizer):
    ids = tokenizer.encode(TEXT).ids
    assert len(ids) > len(TEXT), "the multi-byte characters should take several tokens each"
    stream = TextStream(tokenizer)
    chunks = [text for text, _ in pushed(stream, ids)]
    assert "".join(chunks) + stream.flush() == TEXT == tokenizer.decode(ids)
    assert not any(INCOMPLETE in chunk for chunk in chunks)
    assert chunks.count("") >= 2 * 3 + 2  # 日本語 (3 bytes each) and é, ö (2 bytes) waited for their last byte
    assert chunks == [text for text, _ in pushed(TextStream(DecodeOnly(tokenizer)), ids)]


def test_stop_strings_and_special_tokens(tokenizer):
    eos = tokenizer.token_to_id("<eos>")
    ids = tokenizer.encode(TEXT).ids
    ids = ids[:4] + [eos] + ids[4:]  # a special token inside the reply is not text
    for tok in (tokenizer, DecodeOnly(tokenizer)):
        stream, sent, stopped = TextStream(tok, stop=["語 w", "STOP"]), [], False
        for token in ids:
            text, stopped = stream.push(token)
            sent.append(text)
            if stopped:
                break
        assert stopped and "".join(sent) == stream.text == "héllo 日本"  # the stop string itself is never sent


def test_a_reply_cut_inside_a_character_ends_as_decoding_it_whole_does(tokenizer):
    ids = tokenizer.encode("ok 日").ids[:-1]  # the reply ends after the first two of 日's three bytes
    for tok in (tokenizer, DecodeOnly(tokenizer)):
        stream = TextStream(tok)
        assert "".join(text for text, _ in pushed(stream, ids)) + stream.flush() == tokenizer.decode(ids)


def test_a_generator_reads_its_tokenizer_file_once_and_again_when_it_changes(tmp_path, monkeypatch):
    """`generator.tokenizer` is read from tokenizer.json on first use and kept; a generator handed other tokenizer
    files (as convert_hf's post-step does) reads the new one."""
    from tokenizers import Tokenizer

    from torch2jax.generate.loop import TokenLoop

    from .lms import write_tokenizer

    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
        write_tokenizer(folder)
    reads = []
    real = Tokenizer.from_file
    monkeypatch.setattr(Tokenizer, "from_file", staticmethod(lambda path: reads.append(path) or real(path)))
    loop = object.__new__(TokenLoop)
    loop.tokenizer_files = {"tokenizer.json": first / "tokenizer.json"}
    assert loop.tokenizer is loop.tokenizer
    assert reads == [str(first / "tokenizer.json")]
    loop.tokenizer_files = {"tokenizer.json": second / "tokenizer.json"}
    assert loop.tokenizer.encode("w5 w6").ids == [5, 6]
    assert reads == [str(first / "tokenizer.json"), str(second / "tokenizer.json")]
