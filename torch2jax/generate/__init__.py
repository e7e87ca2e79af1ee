"""Torch-free generation: the generator kinds, the token loop, sampling, prompts and image inputs."""
