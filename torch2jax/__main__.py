"""`python -m torch2jax ...` runs the `torch2jax` command line."""

from torch2jax.cli.main import main

if __name__ == "__main__":
    main(prog_name="torch2jax")
