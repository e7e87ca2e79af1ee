"""`make demo`: convert the tiny GPT with the CLI, load it where torch cannot be imported, compare.

Step 1 (this process, with torch): reference outputs from PyTorch for fresh inputs.
Step 2 (a subprocess with torch blocked): torch2jax.load the artifact, run it, report the difference.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
ARTIFACT = ROOT / "demo_artifact"


def main() -> None:
    python = sys.executable
    cli = Path(python).with_name("torch2jax")
    print("$ torch2jax convert sample_models/tiny_gpt.py:TinyGPT --out demo_artifact --force", flush=True)
    subprocess.run([str(cli), "convert", "sample_models/tiny_gpt.py:TinyGPT", "--out", str(ARTIFACT), "--force"], check=True, cwd=ROOT)

    sys.path.insert(0, str(ROOT / "sample_models"))
    from tiny_gpt import TinyGPT

    torch.manual_seed(0)  # the CLI builds the model with --seed 0: same weights
    model = TinyGPT().eval()
    tokens = torch.randint(0, 128, (3, 24))  # another batch size and length than the example
    with torch.no_grad():
        reference = model(tokens).numpy()
    data = ARTIFACT.parent / "demo_io.npz"
    np.savez(data, tokens=tokens.numpy(), reference=reference)

    check = f"""
import numpy as np, torch2jax
data = np.load({str(data)!r})
model = torch2jax.load({str(ARTIFACT)!r})
out = np.asarray(model(data["tokens"]))
print(f"loaded {{model}} without PyTorch")
print(f"max |jax - torch| = {{np.abs(out - data['reference']).max():.3g}} over {{out.size}} logits")
"""
    print("$ (torch blocked) torch2jax.load('demo_artifact')(tokens)", flush=True)
    subprocess.run([python, str(ROOT / "scripts" / "without_torch.py"), "-c", check], check=True)
    data.unlink()


if __name__ == "__main__":
    main()
