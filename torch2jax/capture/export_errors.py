"""torch.export's and decomposition's failures as messages a user can act on: torch's own reason (its first
paragraph, or a data-dependent guard's condition and the model's line that asked for it) and a hint for the
usual causes (a branch on a tensor's value, a dynamic dim torch found fixed, an output it cannot flatten)."""

from __future__ import annotations

import os

from . import specialize as specialize_inputs


def first_paragraph(err: BaseException) -> str:
    """The first paragraph of `err`'s message: torch's reason, without the graph and advice it appends."""
    text = str(err).strip() or type(err).__name__
    return text.split("\n\n")[0].strip()


def export_failure_message(err: BaseException, fixed: list | None = None) -> str:
    """What torch.export's `err` means for the user's model, and what to try (`fixed`: the inputs it was fixed to)."""
    guard = specialize_inputs.data_dependent_guard(err)
    reason = _guard_reason(err) if guard is not None else first_paragraph(err)
    hint = ""
    lowered = str(err).lower()
    if guard is not None or "data-dependent" in lowered or "could not guard" in lowered:
        hint = (
            "\nThe model branches on a tensor's value. torch.export cannot capture that; "
            "express the branch with torch.cond, or make the condition depend on shapes only"
        )
        if fixed:
            hint += f" (tried with {', '.join(f.name for f in fixed)} fixed to the example value)"
        hint += ". If the value comes from an integer input that describes the data (an image's size), " \
                "specialize=[its name] (--specialize) fixes it to the example value."
    elif "top-level keys must be the arg names" in lowered:
        hint = "\nName the dynamic dims by forward()'s parameter names (the keys torch lists above)."
    elif "constraints violated" in lowered or "specialized" in lowered or "dynamic_shapes" in lowered:
        hint = "\nCheck the dynamic dims you declared: torch found the model needs a fixed size or a narrower range there."
    elif "not a known type" in lowered and "pytree" in lowered:
        hint = (
            "\nThe model takes or returns an object torch.export cannot flatten. For transformers models, "
            "pass use_cache=False (config or kwargs) or return a plain tuple/dict."
        )
    return f"torch.export could not capture the model ({type(err).__name__}):\n{reason}{hint}"


def _guard_reason(err: BaseException) -> str:
    """A data-dependent guard's condition and the model's line that asked for it, without the partial graph torch
    prints before them."""
    lines = [line.strip() for line in str(err).splitlines()]
    cond = next((line for line in lines if line.startswith("Could not guard")), None)
    where = _model_line(err) or next((line for line in lines if line.startswith("Caused by:")), None)
    return "\n".join(line for line in (cond, where) if line) or first_paragraph(err)


def _model_line(err: BaseException) -> str | None:
    """The innermost frame of the failure outside torch and torch2jax: the model's own line."""
    import traceback

    inner = err
    while inner.__cause__ is not None or inner.__context__ is not None:
        inner = inner.__cause__ or inner.__context__
    skip = (os.sep + "torch" + os.sep, os.sep + "torch2jax" + os.sep, os.sep + "contextlib.py", os.sep + "functools.py")
    frames = [f for f in traceback.extract_tb(inner.__traceback__) if not any(part in f.filename for part in skip)]
    if not frames:
        return None
    frame = frames[-1]
    short = frame.filename.split("site-packages" + os.sep)[-1]
    return f"at {short}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"
