"""The portable graph -> a pure JAX function: the graph passes, then the interpreter. Torch-free."""
