"""Code answers checked by running their tests (HumanEval, MBPP) in a sandbox (:mod:`rlvr_verifiers._sandbox`).

Extraction (:func:`extract_code`): the last fenced block tagged ``python``/``py``/``python3`` (a final block cut
off by the token limit counts, up to the end of the text); with none, the last untagged fenced block; with no
fence at all, the whole response (a raw HumanEval-style continuation).

Program assembly (:func:`build_program`), from the data row:

- HumanEval rows (``prompt``, ``test`` defining ``check(candidate)``, ``entry_point``): when the code defines
  ``def <entry_point>`` at column 0 it is a full solution and runs after the prompt (the prompt's imports and
  helper functions stay available, e.g. ``encode_cyclic`` for HumanEval/38; the completion's ``def`` replaces the
  prompt's docstring-only stub); a prompt that does not compile on its own contributes only its ``import``
  lines. Otherwise the code is the body continuing the prompt: ``prompt + code`` (if that does not compile and
  the code re-indented by 4 spaces does, the re-indented body). Then ``test``, then ``check(<entry_point>)``.
- MBPP rows (``test_list``: assert statements, optional ``test_setup_code``): ``test_setup_code + code``, then
  the asserts.
- Any other row: ``gold`` is the test code (assert statements, or a ``check(candidate)`` with
  ``entry_point`` in the row), run after the code.

``gold`` therefore means "the tests" only for rows that carry none of their own; for HumanEval and MBPP rows
it is unused (their gold is the row's tests, not the reference solution).

Scores: 1 when the program and every test run without an exception; else 0 with reason ``no_code`` (nothing
to run), ``no_tests`` (the row has no tests and ``gold`` is empty), ``failed: <ExcType>`` (e.g.
``failed: AssertionError``, ``failed: SyntaxError``), ``timeout``, ``memory``, ``output_limit`` (stdout +
stderr over ``max_output_bytes``), ``crashed`` (the process died or exited before reporting), or
``error: <ExcType>`` when the sandbox itself could not start. ``parsed`` holds the extracted code.
"""

from __future__ import annotations

import re
import textwrap
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from rlvr.types import VerifyResult
from rlvr_verifiers._sandbox import Isolation, Limits, isolation, run_python

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PY_TAGS = {"python", "py", "python3", "py3"}


def extract_code(response: str) -> str:
    """The code of a response (see the module docstring): last ```python block, else last untagged block,
    else the whole text. A fence left open at the end of the text runs to the end."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE_RE.finditer(response)]
    tagged = [code for tag, code in blocks if tag in _PY_TAGS]
    if tagged:
        return tagged[-1]
    untagged = [code for tag, code in blocks if not tag]
    if untagged:
        return untagged[-1]
    return response


def _compiles(source: str) -> bool:
    try:
        compile(source, "<check>", "exec")
    except Exception:  # noqa: BLE001 - SyntaxError, ValueError (null bytes), RecursionError, MemoryError
        return False
    return True


def defines(code: str, name: str) -> bool:
    """True when ``code`` defines ``name`` at top level (``def name(`` or ``async def name(`` at column 0)."""
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def build_program(code: str, gold: str, row: dict[str, Any]) -> tuple[str, str, str | None]:
    """``(program, tests, call)`` for :func:`~rlvr_verifiers._sandbox.run_python` (module docstring).

    ``call`` is the entry point passed to ``check``, or None when the tests are plain asserts. ``tests`` is
    empty when there are none (the caller scores that ``no_tests``).
    """
    entry = row.get("entry_point")
    if row.get("test") and entry:
        prompt = row.get("prompt") or ""
        if defines(code, entry):
            head = prompt if _compiles(prompt) else "\n".join(m.group(0) for m in _import_lines(prompt))
            program = head + "\n" + code
        else:
            program = prompt + code
            if not _compiles(program):
                body = textwrap.indent(textwrap.dedent(code), "    ")
                if _compiles(prompt + body):
                    program = prompt + body
        return program, row["test"], entry
    if row.get("test_list"):
        setup = row.get("test_setup_code") or ""
        return setup + "\n" + code, "\n".join(row["test_list"]), None
    return code, gold or "", entry if gold and entry and "def check" in gold else None


def _import_lines(prompt: str):
    return re.finditer(r"^(?:import|from)\s.*$", prompt, re.MULTILINE)


class CodeVerifier:
    """Runs a completion's tests in a sandbox; score 1 when they all pass (module docstring).

    Args:
        timeout_s: wall-clock limit per run, seconds (the process tree is killed at it); also sets
            ``RLIMIT_CPU`` to ``ceil(timeout_s) + 1`` s.
        memory_mb: address-space limit of the run (``RLIMIT_AS``), MiB.
        max_output_bytes: cap on stdout + stderr together (over it: ``output_limit``) and on each file the
            run writes (``RLIMIT_FSIZE``), bytes.
        nproc: ``RLIMIT_NPROC``: processes and threads of the run's user id (``nobody`` when running as root,
            shared by all runs at that moment).

    The isolation mode is probed on first use (:func:`rlvr_verifiers._sandbox.isolation`); :attr:`isolation`
    names it. Errors: ``ValueError`` for a non-positive limit. ``verify`` never raises.
    """

    def __init__(
        self, timeout_s: float = 10, memory_mb: int = 512, max_output_bytes: int = 1 << 20, nproc: int = 64
    ) -> None:
        if not timeout_s > 0 or memory_mb < 1 or max_output_bytes < 1 or nproc < 1:
            raise ValueError(
                f"CodeVerifier needs positive limits; got timeout_s={timeout_s}, memory_mb={memory_mb}, "
                f"max_output_bytes={max_output_bytes}, nproc={nproc}"
            )
        self.limits = Limits(
            timeout_s=float(timeout_s), memory_mb=int(memory_mb), max_output_bytes=int(max_output_bytes),
            nproc=int(nproc),
        )  # fmt: skip
        self._isolation: Isolation | None = None

    @property
    def isolation(self) -> Isolation:
        """The sandbox's isolation mode on this machine (probed once per process)."""
        if self._isolation is None:
            self._isolation = isolation()
        return self._isolation

    def verify(self, response: str, gold: str, **row: Any) -> VerifyResult:
        """Score 1 if the code in ``response`` passes the row's tests (or ``gold``'s), else 0 with a reason."""
        try:
            code = extract_code(response or "")
            if not code.strip():
                return VerifyResult(score=0.0, parsed=None, reason="no_code")
            program, tests, call = build_program(code, gold, row)
            if not tests.strip():
                return VerifyResult(score=0.0, parsed=code, reason="no_tests")
            result = run_python(program, tests, call, self.limits, self.isolation)
        except Exception as e:  # noqa: BLE001 - the sandbox could not start: never raise on model output
            return VerifyResult(score=0.0, parsed=None, reason=f"error: {type(e).__name__}: {str(e)[:200]}")
        if result.status == "ok":
            return VerifyResult(score=1.0, parsed=code, reason=None)
        return VerifyResult(score=0.0, parsed=code, reason=result.status)

    def verify_many(
        self, responses: Sequence[str], golds: Sequence[str], rows: Sequence[dict[str, Any]], threads: int = 2
    ) -> list[VerifyResult]:
        """``verify`` over ``N`` samples with ``threads`` sandboxes running at once; results in input order.
        Errors: ``ValueError`` when the three sequences differ in length."""
        if not len(responses) == len(golds) == len(rows):
            raise ValueError(f"verify_many needs equal lengths: {len(responses)}, {len(golds)}, {len(rows)}")
        with ThreadPoolExecutor(max_workers=threads) as pool:
            return list(pool.map(lambda a: self.verify(a[0], a[1], **a[2]), zip(responses, golds, rows)))

    def __repr__(self) -> str:
        lim = self.limits
        return (
            f"CodeVerifier(timeout_s={lim.timeout_s}, memory_mb={lim.memory_mb}, "
            f"max_output_bytes={lim.max_output_bytes}, nproc={lim.nproc})"
        )
