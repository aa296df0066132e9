"""Countdown: reach a target number with an arithmetic expression over given numbers.

The gold is the target (an integer, ``"24"``); the data row holds the numbers in ``numbers`` (or ``nums``, as in
the TinyZero data), a list of integers. The answer is an expression with ``+ - * /`` and parentheses that uses
each given number at most once (with ``use_all=True``: each exactly once) and equals the target.

Answer extraction (the whole response is read; the last match wins):

1. the last ``<answer>...</answer>``;
2. else the last complete ``\\boxed{...}``;
3. else the last line that is only an arithmetic expression (digits, ``+ - * / × ÷``, parentheses, spaces).

In 1 and 2 an ``=`` and what follows it are dropped (``(6+4)*2 = 20`` -> ``(6+4)*2``), so the expression, not
the claimed result, is checked.

The expression is never evaluated with ``eval``: it is parsed with :mod:`ast` and only integer literals, the four
binary operators and unary minus are accepted; names, calls, attributes, powers, ``//``, ``%``, floats and
literals over 12 digits are rejected before any arithmetic. Arithmetic is exact (:class:`fractions.Fraction`),
so ``(1/3)*3`` is exactly 1 and ``7/2`` is not 3. The rules (allowed syntax, numbers given and not reused) are
checked before any arithmetic, so ``8/(6-6)`` with one 6 is ``number_reused: 6``, not ``division_by_zero``.

Reasons for a 0: ``no_answer``, ``bad_expression: <what>``, ``unknown_number: <n>`` (not among the given
numbers), ``number_reused: <n>`` (used more often than given), ``unused_numbers: <list>`` (``use_all`` only),
``division_by_zero``, ``wrong`` (valid, but another value; ``parsed`` holds the expression), ``bad_gold`` (the
target is not an integer), ``bad_row: <what>`` (no usable ``numbers``).
"""

from __future__ import annotations

import ast
import collections
import re
from fractions import Fraction
from typing import Any

from rlvr.types import VerifyResult
from rlvr_verifiers.math import find_boxes

MAX_EXPRESSION_CHARS = 500
"""Longer answers are rejected before parsing (``bad_expression: too long``)."""
MAX_LITERAL_DIGITS = 12
"""Integer literals with more digits are rejected (``bad_expression: number too large``)."""

_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_EXPRESSION_LINE_RE = re.compile(r"[\d\s+\-*/()\u00d7\u00f7.]*\d[\d\s+\-*/()\u00d7\u00f7.]*")
_INT_RE = re.compile(r"[+-]?\d+")
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class _Reject(Exception):
    """The expression breaks a rule; the message is the reason."""


def extract_expression(response: str) -> str | None:
    """The answer expression of a response (see the module docstring), cleaned; None when there is none."""
    tags = _ANSWER_TAG_RE.findall(response)
    if tags:
        found = tags[-1]
    else:
        boxes = find_boxes(response)
        if boxes:
            found = boxes[-1][2]
        else:
            lines = [ln.strip() for ln in response.splitlines()]
            found = next((ln for ln in reversed(lines) if _EXPRESSION_LINE_RE.fullmatch(ln)), "")
    found = found.split("=", 1)[0]
    found = found.replace("\\times", "*").replace("\\cdot", "*").replace("\\div", "/")
    found = found.replace("\u00d7", "*").replace("\u00f7", "/").replace("\\left", "").replace("\\right", "")
    found = found.replace("$", "").strip()
    return found or None


def _literals(node: ast.AST, used: list[int]) -> None:
    """Check that ``node`` holds only accepted nodes; append its integer literals to ``used``. Raises _Reject."""
    if isinstance(node, ast.Expression):
        return _literals(node.body, used)
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise _Reject(f"bad_expression: {type(node.value).__name__} literal {node.value!r}")
        used.append(node.value)
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _literals(node.operand, used)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        _literals(node.left, used)
        return _literals(node.right, used)
    what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else type(node).__name__
    raise _Reject(f"bad_expression: {what} not allowed")


def _value(node: ast.AST) -> Fraction:
    """Exact value of a node :func:`_literals` accepted. Raises _Reject on a division by zero."""
    if isinstance(node, ast.Expression):
        return _value(node.body)
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        return -_value(node.operand) if isinstance(node.op, ast.USub) else _value(node.operand)
    assert isinstance(node, ast.BinOp)
    left, right = _value(node.left), _value(node.right)
    if isinstance(node.op, ast.Add):
        return left + right
    if isinstance(node.op, ast.Sub):
        return left - right
    if isinstance(node.op, ast.Mult):
        return left * right
    if right == 0:
        raise _Reject("division_by_zero")
    return left / right


def parse_expression(expression: str) -> tuple[ast.Expression, list[int]]:
    """The checked syntax tree of ``expression`` and its integer literals, in order (no arithmetic done).

    Errors: ``ValueError`` whose message is the reason (``bad_expression: ...``) for an expression that breaks
    the rules of the module docstring. Never evaluates Python code.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"bad_expression: too long ({len(expression)} > {MAX_EXPRESSION_CHARS} characters)")
    if any(len(d) > MAX_LITERAL_DIGITS for d in re.findall(r"\d+", expression)):
        raise ValueError(f"bad_expression: number too large (over {MAX_LITERAL_DIGITS} digits)")
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError) as e:
        raise ValueError(f"bad_expression: does not parse ({type(e).__name__})") from None
    used: list[int] = []
    try:
        _literals(tree, used)
    except _Reject as e:
        raise ValueError(str(e)) from None
    except RecursionError:
        raise ValueError("bad_expression: nested too deeply") from None
    return tree, used


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """Exact value of ``expression`` and the integer literals it uses, in order.

    Errors: ``ValueError`` whose message is the reason (``bad_expression: ...`` or ``division_by_zero``).
    """
    tree, used = parse_expression(expression)
    try:
        return _value(tree), used
    except _Reject as e:
        raise ValueError(str(e)) from None
    except RecursionError:
        raise ValueError("bad_expression: nested too deeply") from None


def parse_target(gold: Any) -> int | None:
    """The target as an int (``"24"``, ``" -3 "``, ``"24.0"`` is not accepted), or None."""
    text = str(gold).strip()
    return int(text) if _INT_RE.fullmatch(text) else None


def _numbers(row: dict[str, Any]) -> list[int] | str:
    """The row's numbers, or a ``bad_row: ...`` reason."""
    nums = row.get("numbers", row.get("nums"))
    if not isinstance(nums, (list, tuple)) or not nums:
        return "bad_row: no 'numbers' list"
    out = []
    for n in nums:
        if isinstance(n, float) and n.is_integer():
            n = int(n)
        if isinstance(n, str) and parse_target(n) is not None:
            n = int(n)
        if isinstance(n, bool) or not isinstance(n, int):
            return f"bad_row: {n!r} in 'numbers' is not an integer"
        out.append(n)
    return out


class CountdownVerifier:
    """Score 1 when the answer expression uses the given numbers legally and equals the target, else 0.

    Args:
        use_all: require every given number to be used exactly once (TinyZero's rule); default: at most once.

    Row fields: ``numbers`` (or ``nums``), a list of integers. ``verify`` never raises.
    """

    def __init__(self, use_all: bool = False) -> None:
        self.use_all = bool(use_all)

    def check_gold(self, gold: str) -> str | None:
        """None when the gold is an integer target, else the reason it is unusable."""
        return None if parse_target(gold) is not None else f"countdown target {str(gold)[:60]!r} is not an integer"

    def verify(self, response: str, gold: str, **row: Any) -> VerifyResult:
        """Score one response against the target ``gold`` with the numbers of ``row``."""
        try:
            return self._verify(str(response), gold, row)
        except Exception as e:  # noqa: BLE001 - untrusted input must not raise (DESIGN: Seams)
            return VerifyResult(score=0.0, parsed=None, reason=f"error: {type(e).__name__}: {str(e)[:200]}")

    def _verify(self, response: str, gold: str, row: dict[str, Any]) -> VerifyResult:
        target = parse_target(gold)
        if target is None:
            return VerifyResult(score=0.0, parsed=None, reason="bad_gold")
        numbers = _numbers(row)
        if isinstance(numbers, str):
            return VerifyResult(score=0.0, parsed=None, reason=numbers)
        expression = extract_expression(response)
        if expression is None:
            return VerifyResult(score=0.0, parsed=None, reason="no_answer")
        try:
            _, used = parse_expression(expression)
        except ValueError as e:
            return VerifyResult(score=0.0, parsed=expression, reason=str(e))
        left = collections.Counter(numbers)
        for n in used:
            if left[n] == 0:
                kind = "number_reused" if n in numbers else "unknown_number"
                return VerifyResult(score=0.0, parsed=expression, reason=f"{kind}: {n}")
            left[n] -= 1
        if self.use_all and +left:
            return VerifyResult(score=0.0, parsed=expression, reason=f"unused_numbers: {sorted((+left).elements())}")
        try:
            value, _ = evaluate(expression)
        except ValueError as e:
            return VerifyResult(score=0.0, parsed=expression, reason=str(e))
        if value != target:
            return VerifyResult(score=0.0, parsed=expression, reason="wrong")
        return VerifyResult(score=1.0, parsed=expression)
