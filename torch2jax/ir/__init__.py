"""The portable graph and what describes it: nodes, symbolic dims, pytree structure, dtypes, input specs.

Torch-free. Everything after capture (the lowering, the runtime, an artifact's graph.json) sees
only these types, never torch's FX graph.
"""
