"""Run Python with `import torch` made to fail, to prove a code path needs no PyTorch.

    python scripts/without_torch.py script.py [args...]
    python scripts/without_torch.py -c "import torch2jax; torch2jax.load('out')"
"""

import runpy
import sys


class _BlockTorch:
    """A meta-path finder that refuses torch and its submodules."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{name} is blocked: this code path must not need PyTorch")
        return None


def main() -> None:
    sys.meta_path.insert(0, _BlockTorch())
    if len(sys.argv) >= 3 and sys.argv[1] == "-c":
        code = sys.argv[2]
        sys.argv = ["-c", *sys.argv[3:]]
        exec(compile(code, "<without_torch>", "exec"), {"__name__": "__main__"})
    elif len(sys.argv) >= 2:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
