"""Everything that knows transformers (torch side): model directories and tasks, the causal-LM and
encoder-decoder steps over the shared KV-cache layout, layer repetition, checkpoint-name rules and
the verification of generation against transformers' own `generate`.

Importing this package imports neither torch nor transformers; its modules do. `capture/` never
imports it; it may import `capture/`, `diagnose/`, `serve/` and `runtime/`.
"""
