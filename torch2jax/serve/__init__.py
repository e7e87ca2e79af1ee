"""Serving: text generation over a converted model's prefill/decode entry points, torch-free."""
