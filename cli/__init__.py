"""The `torch2jax` command line (click). See docs/cli.md."""
