"""The torch side of conversion: torch.export and decomposition, reading the FX graph into the
portable graph, `convert()`, resolving `model.py:Model` targets, torch <-> JAX arrays.

Imports torch; nothing under ir/, ops/, lowering/ or runtime/ may import this package.
"""
