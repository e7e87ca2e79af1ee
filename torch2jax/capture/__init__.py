"""The generic torch side of conversion: torch.export and decomposition, reading the FX graph into the
portable graph, `convert()`, resolving `model.py:Model` targets, torch <-> JAX arrays, fake-parameter
modules and weights streamed from safetensors files.

Imports torch; nothing torch-free may import this package, and it imports neither hf/ nor pipeline/:
what it knows of a library's models (transformers' checkpoint renames) is handed to it as data.
"""
