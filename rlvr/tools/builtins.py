"""Built-in tools: ``calculator`` (exact arithmetic, parsed with :mod:`ast`, never ``eval``) and ``python`` (code run
in the sandbox of the ``code`` verifier, :mod:`rlvr_verifiers._sandbox`: namespaces, resource limits, no network).

Their docstrings are what the model reads (the chat template lists them through their JSON schemas).
"""

from __future__ import annotations

import ast
import math
import operator

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}  # fmt: skip
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS = {"sqrt": math.sqrt, "abs": abs, "round": round, "min": min, "max": max}
MAX_DIGITS = 1000
"""Largest result (in decimal digits) the calculator computes; a bigger power is refused before it is computed."""
MAX_EXPRESSION_CHARS = 2000


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 \
                and right * math.log10(abs(left)) > MAX_DIGITS:
            raise ValueError(f"{left} ** {right} has more than {MAX_DIGITS} digits")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError("division by zero")
        return _BIN[type(node.op)](left, right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords:
        return _FUNCS[node.func.id](*[_eval(a) for a in node.args])
    what = ast.unparse(node) if hasattr(ast, "unparse") else type(node).__name__
    raise ValueError(f"unsupported: {what!r} (numbers, + - * / // % **, parentheses, {', '.join(_FUNCS)})")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return its value.

    Supports whole and decimal numbers, + - * / // % ** and parentheses, and the functions sqrt, abs, round,
    min and max. Whole numbers are exact at any size, e.g. 123456789 * 987654321.

    Args:
        expression: The arithmetic expression, e.g. "(17 + 25) * 3 / 4".
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {e.msg}") from None
    value = _eval(tree)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value)) if "/" not in expression else repr(value)
    return repr(value) if isinstance(value, float) else str(value)


TIMEOUT_S = 10.0
"""The ``python`` tool's wall-clock limit: set by the tool worker from ``tools.timeout_s`` (a little under it, so the
sandbox reports the timeout and the output so far before the worker is killed)."""
MEMORY_MB = 512
MAX_OUTPUT_BYTES = 1 << 16

_WRAP = """import sys, traceback
try:
    exec(compile(sys.argv_code, "<code>", "exec"), {"__name__": "__main__"})
except BaseException as _e:
    _tb = traceback.extract_tb(_e.__traceback__)
    _line = next((f.lineno for f in reversed(_tb) if f.filename == "<code>"), None)
    sys.stdout.flush()
    print(("line %s: " % _line if _line else "") + "".join(traceback.format_exception_only(type(_e), _e)).strip(),
          file=sys.stderr)
    raise
"""


def python(code: str) -> str:
    """Run Python code in a fresh sandboxed interpreter (standard library only, no network, no files kept) and return
    what it prints. Errors are returned as their line and message. Use print() to see values.

    Args:
        code: The Python program to run, e.g. "print(sum(range(1, 101)))".
    """
    from rlvr_verifiers._sandbox import Limits, run_python

    program = "import sys\nsys.argv_code = " + repr(code) + "\n" + _WRAP
    result = run_python(program, "", None, Limits(timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB,
                                                  max_output_bytes=MAX_OUTPUT_BYTES))
    out = result.output.decode("utf-8", "replace")
    if result.status == "ok":
        return out
    status = {"timeout": f"timed out after {TIMEOUT_S:g} s", "memory": f"out of memory ({MEMORY_MB} MiB)",
              "output_limit": f"output over {MAX_OUTPUT_BYTES} bytes", "crashed": "the interpreter crashed"}.get(
        result.status, "")  # fmt: skip
    return out + (f"\nerror: {status}" if status else "")
