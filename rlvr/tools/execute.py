"""Tool calls in worker processes with hard limits: a :class:`~rlvr.runtime.sandbox.ProcessPool` (the machinery the
scoring and environment pools use) whose workers import the recipe's tools once.

Each call runs in a worker with ``timeout_s`` wall-clock seconds (past it the worker is killed and replaced) and
``memory_mb`` of address space; what it prints and what it returns together are capped at ``max_output_chars``
(the end is cut: ``... [N characters cut]``). A call that times out, crashes its worker, raises, or returns
something that is not text becomes an error message for the model and a counted failure; the batch goes on. The
calls given to one :meth:`ToolPool.run` run in parallel, one per worker.

Stateful tools (:mod:`rlvr.tools.registry`): a call carries its instance's pickle; the worker unpickles it, runs
the method and pickles it back with the result (an instance that no longer pickles makes the call an error naming
its class). :meth:`ToolPool.create` builds instances and :meth:`ToolPool.close_instances` calls their ``close()``,
each in a worker with the same limits.

Network: each worker leaves the network (a network namespace of its own, when it may: running as root) and installs
an audit hook refusing internet sockets (``AF_INET``/``AF_INET6``) and name lookups, so a tool that tries the
network fails with ``PermissionError``/``OSError``. The ``python`` tool runs code in the ``code`` verifier's
sandbox on top (:mod:`rlvr_verifiers._sandbox`).
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from typing import Any, Callable

from rlvr.runtime.sandbox import ProcessPool
from rlvr.tools.registry import Tool

CLONE_NEWNET = 0x40000000


class _Capped(io.TextIOBase):
    """A text stream keeping its first ``cap`` characters and counting the rest (a tool that prints 1 GB costs no
    memory)."""

    def __init__(self, cap: int) -> None:
        self.cap, self.head, self.total = cap, [], 0
        self._kept = 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        s = str(s)
        self.total += len(s)
        room = self.cap - self._kept if self.cap > 0 else len(s)
        if room > 0:
            self.head.append(s[:room])
            self._kept += min(room, len(s))
        return len(s)


def _no_net(event: str, args: tuple) -> None:
    if event == "socket.__new__" and len(args) > 1 and args[1] in (2, 10):
        raise PermissionError("network access is disabled for tools")
    if event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr"):
        raise PermissionError("network access is disabled for tools")
    if event in ("socket.connect", "socket.bind", "socket.sendto") and args and \
            getattr(args[0], "family", None) in (2, 10):
        raise PermissionError("network access is disabled for tools")


def _leave_network() -> str:
    """Best effort: a network namespace of this process's own (only a loopback that is down); then the audit hook.
    Returns how the network is closed."""
    import sys

    how = "audit hook"
    if os.geteuid() == 0:
        try:
            import ctypes

            if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) == 0:
                how = "network namespace + audit hook"
        except (OSError, AttributeError):
            pass
    sys.addaudithook(_no_net)
    return how


def _text(value: Any) -> str:
    """A tool's return value as text: a string as is, None as empty, JSON-able values as JSON.
    Errors: ``TypeError`` for anything else (the call is reported as returning garbage)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        raise TypeError(f"the tool returned a {type(value).__name__}, not text or a JSON value") from None


STATE_MUST_PICKLE = ("a stateful tool's state must pickle (it is kept with the trajectory, pickled, between calls): "
                     "keep only picklable values (numbers, text, lists, dicts...) in its attributes")


def _pickled(obj: Any) -> bytes:
    """``obj``'s pickle; ``TypeError`` naming its class and saying why state must pickle."""
    import pickle

    try:
        return pickle.dumps(obj)
    except Exception as e:  # noqa: BLE001 - pickling raises TypeError, PicklingError, AttributeError...
        raise TypeError(f"the {type(obj).__name__} instance does not pickle ({type(e).__name__}: {str(e)[:200]}); "
                        f"{STATE_MUST_PICKLE}") from None


def _handler(targets: tuple[str, ...], timeout_s: float, max_output_chars: int) -> Callable[[tuple], Any]:
    """A worker's handler. Jobs:

    - ``("call", target, method, arguments, state)`` -> ``("ok", text, chars cut, new state)`` or
      ``("error", message, 0, None)``: a function call (``method`` None, ``state`` None), or a method called on the
      instance ``state`` (its pickle) unpickles to; the instance is pickled back after an ``ok`` call (a call that
      raises, or leaves an instance that does not pickle, is an error and changes nothing);
    - ``("create", target)`` -> ``("ok", pickle of target())`` or ``("error", message)``;
    - ``("close", target, state)`` -> ``("ok", "")`` or ``("error", message)``: the instance's ``close()``.
    """
    import contextlib
    import pickle

    from rlvr.tools import builtins
    from rlvr.tools.registry import resolve_target

    objs = {t: resolve_target(t) for t in targets}  # imports each module once: instances unpickle by reference
    builtins.TIMEOUT_S = max(0.1, timeout_s - 0.5)
    builtins.MAX_OUTPUT_BYTES = max(1024, 4 * max_output_chars)
    _leave_network()

    def lifecycle(job: tuple) -> tuple[str, Any]:
        cls = objs[job[1]]
        if job[0] == "create":
            try:
                instance = cls()
            except Exception as e:  # noqa: BLE001 - the model is told; the trajectory goes on
                return "error", f"{cls.__name__}() failed: {type(e).__name__}: {str(e)[:500]}"
            try:
                return "ok", _pickled(instance)
            except TypeError as e:
                return "error", str(e)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                pickle.loads(job[2]).close()
            return "ok", ""
        except Exception as e:  # noqa: BLE001 - reported to the runner, which counts and logs it
            return "error", f"{cls.__name__}.close() failed: {type(e).__name__}: {str(e)[:500]}"

    def handle(job: tuple) -> Any:
        if job[0] != "call":
            return lifecycle(job)
        _, target, method, arguments, state = job
        out = _Capped(max_output_chars)
        new_state = None
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                if method is None:
                    value = _text(objs[target](**arguments))
                else:
                    instance = pickle.loads(state)
                    value = _text(getattr(instance, method)(**arguments))
            if method is not None:
                new_state = _pickled(instance)
        except Exception as e:  # noqa: BLE001 - a tool's failure is the model's information, not a crash
            return "error", f"{type(e).__name__}: {str(e)[:500]}", 0, None
        printed, whole = "".join(out.head), out.total + len(value)  # printed: the first max_output_chars
        if max_output_chars > 0 and whole > max_output_chars:
            cut = whole - max_output_chars
            return "ok", (printed + value)[:max_output_chars] + f"... [{cut} characters cut]", cut, new_state
        return "ok", printed + value, 0, new_state

    return handle


OUTCOMES = ("ok", "error", "timeout", "crashed")
"""A call's outcomes (:attr:`ToolResult.status`), each counted per tool (``tools/<tool>/<outcome>``)."""


@dataclass(frozen=True)
class ToolResult:
    """One call's outcome: ``status`` ``ok``, ``error`` (the tool raised or returned garbage), ``timeout`` or
    ``crashed``; ``text`` what the model is shown; ``chars_cut`` by the output cap; ``latency_s`` the call's wall
    time in the pool; ``state``: a stateful tool's instance after an ``ok`` call (its pickle; None otherwise: a
    failed call leaves the state it was given)."""

    name: str
    status: str
    text: str
    chars_cut: int = 0
    latency_s: float = 0.0
    state: bytes | None = None


class ToolPool:
    """Runs tool calls in ``num_workers`` processes (module docstring); ``tools``: the recipe's resolved tools.

    Errors: ``RuntimeError`` when a worker cannot import the tools (the message holds the traceback); those of
    :class:`~rlvr.runtime.sandbox.ProcessPool` for bad sizes."""

    def __init__(self, tools: list[Tool], num_workers: int, timeout_s: float, max_output_chars: int,
                 memory_mb: int | None = None) -> None:
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        targets = tuple(dict.fromkeys(t.target for t in tools))
        self._pool = ProcessPool(_handler, (targets, timeout_s, max_output_chars), num_workers,
                                 timeout_s, memory_mb, name="tool", what="the tools",
                                 preload=("rlvr.tools.execute", "rlvr.tools.builtins"))  # fmt: skip

    def run(self, calls: list[tuple[Tool, dict[str, Any]]], states: list[bytes | None] | None = None
            ) -> list[ToolResult]:
        """[N] results, in order; the calls run in parallel (one per worker at a time). ``states[k]``: the pickle
        of the instance call k's method runs on (a stateful tool; None for a function); an ``ok`` result carries
        the instance after the call."""
        if not calls:
            return []
        states = states if states is not None else [None] * len(calls)
        outcomes = self._pool.run([("call", tool.target, tool.method, args, state)
                                   for (tool, args), state in zip(calls, states)])  # fmt: skip
        out = []
        for (tool, _), o in zip(calls, outcomes):
            if o.ok:
                status, text, cut, state = o.value
                out.append(ToolResult(tool.name, status, text if status == "ok" else f"error: {text}", cut,
                                      o.latency_s, state))  # fmt: skip
            elif o.reason == "timeout":
                out.append(ToolResult(tool.name, "timeout", f"error: {tool.name} did not finish within "
                                                            f"{self.timeout_s:g} s and was stopped", 0, o.latency_s))
            elif o.reason == "crashed":
                mem = f" (over {self.memory_mb} MiB of memory?)" if self.memory_mb else ""
                out.append(ToolResult(tool.name, "crashed", f"error: {tool.name} crashed: its process died{mem}", 0,
                                      o.latency_s))  # fmt: skip
            else:  # a job that did not pickle, a handler bug
                out.append(ToolResult(tool.name, "error", f"{o.reason}", 0, o.latency_s))
        return out

    def _lifecycle(self, jobs: list[tuple]) -> list[tuple[Any, str | None]]:
        """Per job ``(value, None)`` or ``(None, what went wrong)``."""
        if not jobs:
            return []
        out: list[tuple[Any, str | None]] = []
        for o in self._pool.run(jobs):
            if not o.ok:
                what = {"timeout": f"did not finish within {self.timeout_s:g} s and was stopped",
                        "crashed": "its process died"}.get(o.reason or "", o.reason)  # fmt: skip
                out.append((None, what))
            else:
                status, value = o.value
                out.append((value, None) if status == "ok" else (None, value))
        return out

    def create(self, tools: list[Tool]) -> list[tuple[bytes | None, str | None]]:
        """One new instance of each stateful tool's class, built in a worker (with the call time limit): per tool
        ``(its pickle, None)`` or ``(None, why not)`` (``__init__`` raised or timed out, the instance does not
        pickle)."""
        return self._lifecycle([("create", t.target) for t in tools])

    def close_instances(self, items: list[tuple[Tool, bytes]]) -> list[str | None]:
        """``close()`` on each ``(tool, instance pickle)``, in a worker with the call time limit: per item None, or
        what went wrong (it raised, timed out or crashed its worker). Never raises for an instance's failure."""
        return [why for _, why in self._lifecycle([("close", t.target, state) for t, state in items])]

    def stats(self) -> dict[str, int]:
        return self._pool.stats()

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> "ToolPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
