"""Serving, torch-free: text generation over a converted model's entry points (prefill/decode,
encode/decode), a generator as an artifact, and any artifact saved, loaded and described."""
