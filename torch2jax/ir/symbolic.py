"""Symbolic dimension expressions: evaluate the strings in graph shapes ("2*seq", "FloorDiv(n, 2)")
against the actual dims bound at trace time (ints, or jax.export symbolic dims).

A tiny evaluator over a whitelist of operators and functions: nothing in a graph file is ever
passed to `eval`.
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Mapping
from typing import Any

from jax import core as jax_core

from ..errors import GraphFormatError


def _floordiv(a, b):
    return a // b


def _ceildiv(a, b):
    return -((-a) // b)


def _max(*xs):
    return functools.reduce(lambda a, b: max(a, b) if isinstance(a, int) and isinstance(b, int) else jax_core.max_dim(a, b), xs)


def _min(*xs):
    return functools.reduce(lambda a, b: min(a, b) if isinstance(a, int) and isinstance(b, int) else jax_core.min_dim(a, b), xs)


_FUNCTIONS = {
    "FloorDiv": _floordiv,
    "floor": lambda a: a,  # applied only to integer-valued results of FloorDiv-like forms
    "CeilDiv": _ceildiv,
    "CleanDiv": _floordiv,
    "IntTrueDiv": _floordiv,
    "CeilToInt": lambda a: a,
    "FloorToInt": lambda a: a,
    "TruncToInt": lambda a: a,
    "Mod": operator.mod,
    "PythonMod": operator.mod,
    "Max": _max,
    "Min": _min,
}

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def evaluate(expr: int | str, env: Mapping[str, Any]) -> Any:
    """The value of a dim: ints pass through, strings are evaluated with symbols from `env`."""
    if isinstance(expr, int):
        return expr
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise GraphFormatError(f"cannot parse symbolic dimension {expr!r}") from None
    return _eval(tree.body, env, expr)


def _eval(node: ast.AST, env: Mapping[str, Any], expr: str) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise GraphFormatError(f"symbolic dimension {expr!r} uses unknown symbol {node.id!r}")
        return env[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval(node.left, env, expr), _eval(node.right, env, expr))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, env, expr)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords:
        return _FUNCTIONS[node.func.id](*(_eval(a, env, expr) for a in node.args))
    raise GraphFormatError(f"unsupported form in symbolic dimension {expr!r}")


def is_symbol(expr: int | str) -> bool:
    """True for a bare symbol name ("batch"), the kind an input shape can bind."""
    return isinstance(expr, str) and expr.isidentifier()
