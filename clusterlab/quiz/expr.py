"""Safe arithmetic expressions for numeric questions.

A numeric question in the bank maps its drawn parameters to the arguments of a
`clusterlab.models` function with small expressions such as ``"alpha_us * 1e-6"`` or
``"8 / (B * 1e9)"``. They are data, so they are never handed to `eval`: `compile_expr` parses
them with `ast` and accepts only numbers, strings, names, + - * / // % **, unary minus and
a short list of math functions. Anything else (attributes, subscripts, lambdas, calls of
other names) is rejected when the bank is loaded, naming the offending piece.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass


def _harmonic(n: float) -> float:
    """H_n = 1 + 1/2 + ... + 1/n, summed here so that expressions do not depend on models."""
    k = int(n)
    if k != n or k < 0:
        raise ValueError(f"H(n) needs a non-negative integer, got {n!r}")
    return math.fsum(1.0 / i for i in range(1, k + 1))


FUNCTIONS: dict[str, Callable[..., float]] = {
    "ceil": math.ceil,
    "floor": math.floor,
    "log": math.log,
    "log2": math.log2,
    "log10": math.log10,
    "sqrt": math.sqrt,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "abs": abs,
    "min": min,
    "max": max,
    "round": round,
    "int": int,
    "H": _harmonic,
}
CONSTANTS = {"pi": math.pi, "e": math.e}

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class ExpressionError(ValueError):
    """An expression that is not allowed, or that refers to an unknown name."""


@dataclass(frozen=True)
class Expr:
    """A parsed, checked expression: `names` are the free variables it reads."""

    source: str
    tree: ast.expr | None
    literal: object
    names: frozenset[str]

    def __call__(self, env: Mapping[str, object]) -> object:
        if self.tree is None:
            return self.literal
        return _eval(self.tree, env)


def compile_expr(source: str | int | float) -> Expr:
    """Parse `source` (or wrap a literal number) and check every node is allowed."""
    if isinstance(source, bool):
        raise ExpressionError(f"a boolean is not an expression: {source!r}")
    if isinstance(source, int | float):
        return Expr(str(source), None, source, frozenset())
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ExpressionError(f"cannot parse {source!r}: {exc.msg}") from None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                raise ExpressionError(f"{source!r}: only {sorted(FUNCTIONS)} may be called")
            if node.keywords:
                raise ExpressionError(f"{source!r}: keyword arguments are not allowed")
        elif isinstance(node, ast.Name):
            if node.id not in FUNCTIONS and node.id not in CONSTANTS:
                names.add(node.id)
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float | str):
                raise ExpressionError(f"{source!r}: constant {node.value!r} is not allowed")
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINARY:
                raise ExpressionError(f"{source!r}: operator {type(node.op).__name__} not allowed")
        elif isinstance(node, ast.UnaryOp):
            if type(node.op) not in _UNARY:
                raise ExpressionError(f"{source!r}: operator {type(node.op).__name__} not allowed")
        elif not isinstance(node, ast.Load | ast.operator | ast.unaryop):
            raise ExpressionError(f"{source!r}: {type(node).__name__} is not allowed")
    return Expr(source, tree, None, frozenset(names))


def _eval(node: ast.expr, env: Mapping[str, object]) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        raise ExpressionError(f"unknown name {node.id!r}")
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, env))
    if isinstance(node, ast.Call):
        assert isinstance(node.func, ast.Name)
        return FUNCTIONS[node.func.id](*(_eval(a, env) for a in node.args))
    raise ExpressionError(f"{type(node).__name__} is not allowed")  # compile_expr prevents it
