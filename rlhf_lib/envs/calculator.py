"""The calculator environment: the policy may call a calculator before it answers an arithmetic question.

A policy message holding `<calc>EXPRESSION</calc>` is a tool call: the environment evaluates the expression (integers,
+ - * / // % and parentheses; nothing else is ever evaluated: it is parsed with `ast`, never `eval`) and answers with
the result, reward 0. Any other message is the final answer: reward 1 when its first integer is the row's `answer`,
else 0, and the episode ends. The arithmetic task's exact match (`rlhf_lib.rewards.builtin:exact_match`) reads
answers the same way.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Mapping
from typing import Any

from rlhf_lib.envs.base import Step
from rlhf_lib.rewards.builtin import first_integer, read_integer

CALL = re.compile(r"<calc>(.*?)</calc>", re.S)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod, ast.Div: operator.truediv}
MAX_DIGITS = 30  # a result or operand longer than this is refused (no exponent operator either: no huge numbers)


class CalcError(ValueError):
    """An expression the calculator refuses: the message is what the policy reads back."""


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression, or `CalcError`.

    >>> evaluate("37 + 48")
    85
    >>> evaluate("(7 - 2) * 3")
    15
    """
    if len(expression) > 200:
        raise CalcError("expression too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalcError(f"cannot parse {expression.strip()!r}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalcError("division by zero")
        return _checked(_OPS[type(node.op)](left, right))
    raise CalcError(f"unsupported: {ast.dump(node)[:40]}")


def _checked(v: int | float) -> int | float:
    """`v` within the calculator's range: finite, under MAX_DIGITS digits (compared as numbers, never converted to
    text or to int from an infinity), an integral float as an int."""
    if isinstance(v, float) and not math.isfinite(v):
        raise CalcError("number too large")
    if abs(v) >= 10**MAX_DIGITS:
        raise CalcError("number too large")
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def answer_of(message: str) -> int | None:
    """The first integer of a message, the answer as exact match reads it; None without one (or when its digit run
    is longer than an answer can be: `rlhf_lib.rewards.builtin.MAX_ANSWER_DIGITS`)."""
    return first_integer(message)


class CalculatorEnv:
    """See the module docstring. The row must have an `answer` column (the arithmetic task writes one)."""

    def __init__(self) -> None:
        self.answer: int | None = None

    def reset(self, row: Mapping[str, Any]) -> None:
        if row.get("answer") is None:
            raise ValueError("the calculator environment needs an 'answer' column on the prompts "
                             "(data.task: arithmetic writes one)")
        self.answer = read_integer(str(row["answer"]).strip())
        if self.answer is None:
            raise ValueError(f"the calculator environment: the row's answer {str(row['answer'])[:40]!r} is not an "
                             "integer")

    def step(self, message: str) -> Step:
        call = CALL.search(message)
        if call is not None:
            try:
                result = evaluate(call.group(1))
            except CalcError as e:
                return Step(f"error: {e}")
            return Step(f"{result:g}" if isinstance(result, float) else str(result))
        return Step(None, 1.0 if answer_of(message) == self.answer else 0.0, done=True)


ONE_OP = re.compile(r"^\s*(-?\d{1,12})\s*([-+*])\s*(-?\d{1,12})\s*$")


class OneOpCalculatorEnv(CalculatorEnv):
    """The calculator of chained problems (`data.operands: chain`): one operation of two integers a call
    (`<calc>37 + 48</calc>`; + - *), so a problem of k operations needs k calls whose operands the policy chooses.
    A call holding anything else (two operations, parentheses, a division) is answered with an error and reward 0;
    the episode goes on. The final answer is read as `CalculatorEnv`'s."""

    def step(self, message: str) -> Step:
        call = CALL.search(message)
        if call is None:
            return super().step(message)
        m = ONE_OP.match(call.group(1))
        if m is None:
            return Step("error: one operation of two integers a call (+, - or *)")
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        return Step(str(_OPS[{"+": ast.Add, "-": ast.Sub, "*": ast.Mult}[op]](a, b)))
