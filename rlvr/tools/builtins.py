"""Built-in tools: ``calculator`` (exact arithmetic, parsed with :mod:`ast`, never ``eval``) and ``python`` (code run
in the sandbox of the ``code`` verifier, :mod:`rlvr_verifiers._sandbox`: namespaces, resource limits, no network;
inside the isolation every tool call gets, :mod:`rlvr.tools.isolation`);
two stateful ones (:mod:`rlvr.tools.registry`: one instance per trajectory): ``python_session``
(:class:`PythonSession`, an interpreter session whose variables persist between calls) and ``files``
(:class:`Files`, a small in-memory file system).

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
"""The ``python`` tool's wall-clock limit: set by the tool server from its call limit (a little under it, so the
sandbox reports the timeout and the output so far before the call is stopped)."""
MEMORY_MB = 512
MAX_OUTPUT_BYTES = 1 << 16
ISOLATION = None
"""The ``python`` tool sandbox's isolation (a :class:`rlvr_verifiers._sandbox.Isolation`): set by a tool server
(:mod:`rlvr.tools.isolation`) to what its calls' user gets inside the server's own isolation, probed once; None:
the sandbox probes in this process (:func:`rlvr_verifiers._sandbox.isolation`)."""

_WRAP = """import sys, traceback
class _Null:
    def write(self, s):
        return len(s)
    def flush(self):
        pass
_g = {"__name__": "__main__"}
for _i, _cell in enumerate(sys.argv_cells):  # earlier cells of a session, replayed silently
    _out, _err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = _Null()
    try:
        exec(compile(_cell, "<earlier call %d>" % (_i + 1), "exec"), _g)
    except BaseException as _e:
        sys.stdout, sys.stderr = _out, _err
        print("error: replaying earlier call %d of this session failed: %s" % (_i + 1, "".join(
            traceback.format_exception_only(type(_e), _e)).strip()), file=sys.stderr)
        raise SystemExit(3)
    sys.stdout, sys.stderr = _out, _err
try:
    exec(compile(sys.argv_code, "<code>", "exec"), _g)
except BaseException as _e:
    _tb = traceback.extract_tb(_e.__traceback__)
    _line = next((f.lineno for f in reversed(_tb) if f.filename == "<code>"), None)
    sys.stdout.flush()
    print(("line %s: " % _line if _line else "") + "".join(traceback.format_exception_only(type(_e), _e)).strip(),
          file=sys.stderr)
    raise
"""


def _run_code(code: str, earlier: list[str]) -> tuple[str, bool]:
    """Run ``code`` in a fresh sandboxed interpreter after the ``earlier`` programs (run first, in order, in the
    same namespace, their output discarded). Returns (what the model is shown: the output, and an ``error:`` line
    for a timeout, memory, output or crash limit; True when ``code`` ran to its end without an error)."""
    from rlvr_verifiers._sandbox import Limits, run_python

    program = "import sys\nsys.argv_cells = " + repr(list(earlier)) + "\nsys.argv_code = " + repr(code) + "\n" + _WRAP
    result = run_python(program, "", None, Limits(timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB,
                                                  max_output_bytes=MAX_OUTPUT_BYTES), ISOLATION)
    out = result.output.decode("utf-8", "replace")
    if result.status == "ok":
        return out, True
    status = {"timeout": f"timed out after {TIMEOUT_S:g} s", "memory": f"out of memory ({MEMORY_MB} MiB)",
              "output_limit": f"output over {MAX_OUTPUT_BYTES} bytes", "crashed": "the interpreter crashed"}.get(
        result.status, "")  # fmt: skip
    return out + (f"\nerror: {status}" if status else ""), False


def python(code: str) -> str:
    """Run Python code in a fresh sandboxed interpreter (standard library only, no network, no files kept) and return
    what it prints. Errors are returned as their line and message. Use print() to see values.

    Args:
        code: The Python program to run, e.g. "print(sum(range(1, 101)))".
    """
    return _run_code(code, [])[0]


MAX_SESSION_CALLS = 50
"""The most successful calls a :class:`PythonSession` keeps (each later call replays them all)."""


class PythonSession:
    """A Python interpreter session for one trajectory (built-in ``python_session``): variables, functions and
    imports persist between its calls.

    State: the list of earlier successful calls' code (:attr:`cells`). The sandbox keeps no process between calls,
    so each call starts a fresh interpreter (as :func:`python` does), replays the earlier cells silently (their
    output discarded; their time counts against this call's limit) and runs the new code, showing only its output.
    Replaying is exact for deterministic code; code that reads the clock, draws unseeded random numbers or depends
    on files from the sandbox's (deleted) folder gives new values when it is replayed. A call that fails (raises,
    times out, runs out of memory) is not kept. Nothing to release: no ``close``."""

    def __init__(self) -> None:
        self.cells: list[str] = []

    def python(self, code: str) -> str:
        """Run Python code in this conversation's interpreter session and return what it prints. Variables, functions
        and imports defined by your earlier successful calls are still there (a call that raised an error is
        discarded). Standard library only, no network. Errors are returned as their line and message. Use print()
        to see values.

        Args:
            code: The Python code to run, e.g. "x = 21" then, in a later call, "print(x * 2)".
        """
        if len(self.cells) >= MAX_SESSION_CALLS:
            return f"error: this session holds at most {MAX_SESSION_CALLS} calls; nothing was run"
        out, ok = _run_code(code, self.cells)
        if ok:
            self.cells.append(code)
        return out


MAX_FILE_BYTES = 1 << 20
"""The most bytes (UTF-8) the files of one :class:`Files` hold together."""


class Files:
    """A small in-memory file system for one trajectory (built-in ``files``): text files by path, kept between calls
    (:attr:`files`), at most :data:`MAX_FILE_BYTES` in all. No directories: a path is a name (``notes/a.txt`` is
    one name). Nothing to release: no ``close``."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def write_file(self, path: str, content: str) -> str:
        """Write a text file, replacing it if it exists. The files last for this conversation only.

        Args:
            path: The file's name, e.g. "notes.txt".
            content: The whole text of the file.
        """
        if not path.strip():
            raise ValueError("the path is empty")
        size = sum(len(v.encode()) for k, v in self.files.items() if k != path) + len(content.encode())
        if size > MAX_FILE_BYTES:
            raise ValueError(f"the files would hold {size} bytes, over the {MAX_FILE_BYTES}-byte limit; nothing was "
                             "written")
        self.files[path] = content
        return f"wrote {len(content)} characters to {path}"

    def read_file(self, path: str) -> str:
        """Return the text of a file written earlier.

        Args:
            path: The file's name, e.g. "notes.txt".
        """
        if path not in self.files:
            raise FileNotFoundError(f"no file {path!r}; the files: {', '.join(sorted(self.files)) or 'none'}")
        return self.files[path]

    def list_files(self) -> str:
        """List the files written so far, one name per line with its size in characters."""
        return "\n".join(f"{k} ({len(v)} characters)" for k, v in sorted(self.files.items())) or "no files"
