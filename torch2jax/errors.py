"""The project's error types: each one carries a message that names the problem and the fix."""

from __future__ import annotations


class Torch2JaxError(Exception):
    """Base class for every error torch2jax raises on purpose."""


class InputSpecError(Torch2JaxError, ValueError):
    """An input description (CLI `--input`, dynamic shapes) could not be understood."""


class InputMutationWarning(UserWarning):
    """forward() writes into its inputs in place: the JAX function returns the same outputs, but its caller's arrays
    keep their values (JAX arrays are immutable)."""


class ExportError(Torch2JaxError):
    """torch.export could not capture the module; the message carries torch's reason."""


class UnsupportedOpsError(Torch2JaxError):
    """The graph uses ops that have no JAX lowering; all of them are listed at once."""

    def __init__(self, message: str, ops: list[str], graph=None):
        super().__init__(message)
        self.ops = ops
        self.graph = graph  # the portable graph the ops were found in, for a reproduction script


class ExamplePathError(Torch2JaxError, ValueError):
    """The inputs gave another value, at a place where the model reads one from its tensors to decide a shape or a
    branch, than the example inputs the model was converted with (capture/example_path.py)."""

    def __init__(self, example_values: dict, flags, draws_random: bool = False):
        self.failed = [(symbol, info) for (symbol, info), ok in zip(example_values.items(), flags) if not ok]
        lines = ["these inputs take another path through the model than the example inputs it was converted with; "
                 "the model reads a value from its tensors to decide a shape or a branch, and these inputs give another:"]
        for symbol, info in self.failed[:10]:
            taken = f"gave {info['value']} ({symbol})" if "value" in info else f"satisfied `{info['condition']}`"
            place = self.place(info)
            lines.append(f"  - the example {taken}" + (f" at {place}" if place else ""))
        if len(self.failed) > 10:
            lines.append(f"  - and {len(self.failed) - 10} more (.failed lists them)")
        lines.append("Convert the model with example inputs that take the path these take (the same counts of selected "
                     "tokens or patches, the same branch), or one converted model per such path.")
        lines.append("Where the value decides a branch (`if mask.any():`), write that branch with torch.cond(pred, "
                     "true_fn, false_fn, operands): torch.cond converts both branches, and the converted model takes the "
                     "one each call's inputs select.")
        if draws_random:
            lines.append("This model draws random numbers: where such a value depends on them (a length sampled from noise), "
                         "no input takes the example's path reliably, and the model cannot be converted this way.")
        super().__init__("\n".join(lines))

    @staticmethod
    def place(info: dict) -> str | None:
        """Where the model reads the value: `file:line: code` as far as the record has them (graphs saved before
        file and line were recorded have the code line alone)."""
        position = f"{info['file']}:{info['line']}" if info.get("file") and info.get("line") is not None else None
        code = info.get("at")
        if position and code:
            return f"{position}: {code}"
        return position or code


class LoweringError(Torch2JaxError):
    """A lowering failed while tracing one node of the graph."""

    def __init__(self, message: str, node=None):
        super().__init__(message)
        self.node = node  # the graph node whose lowering failed, when known


class ArtifactError(Torch2JaxError):
    """An artifact directory is missing, damaged, foreign or from a newer format."""


class SignatureError(Torch2JaxError, TypeError):
    """A converted or loaded model was called with inputs that do not match its signature."""


class VerificationError(Torch2JaxError):
    """The converted model's outputs differ from PyTorch's beyond tolerance."""


class GraphFormatError(ArtifactError):
    """A portable graph (graph.json) is malformed."""


class ShardingError(Torch2JaxError, ValueError):
    """A mesh or sharding rule that cannot place the params: names the rule, the param and the mesh axis."""
