"""PyTorch code on JAX without export: `torch.compile(backend="torch2jax")` (compile.py)."""
