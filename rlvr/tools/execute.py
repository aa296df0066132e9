"""Tool calls with hard limits, isolated: a :class:`~rlvr.workers.ProcessPool` (the machinery the scoring
and environment pools use) whose workers run no tool code: each starts a tool server per distinct
:class:`~rlvr.tools.registry.Access` of the recipe's tools, and every call runs in a process of its own forked by
that server, in the isolation of :mod:`rlvr.tools.isolation` (namespaces where the machine allows, a folder of its
own, a scrubbed environment, no network, its whole process tree killed when it ends). The pool logs at start which
isolation this machine gives and what holds in it, and what each tool that opened something may reach.

Each call has ``timeout_s`` wall-clock seconds (the server stops it a little before, at ``timeout_s`` minus
min(0.5 s, a quarter); the pool kills the worker at ``timeout_s`` if the server does not answer) and ``memory_mb``
of address space; what it prints and what it returns together are capped at ``max_output_chars`` (the end is cut:
``... [N characters cut]``). A call that times out, crashes its process, raises, or returns something that is not
text becomes an error message for the model and a counted failure; the batch goes on. The calls given to one
:meth:`ToolPool.run` run in parallel, one per worker. A call's process starts from the state the server had after
importing the tools: what one call changes in a module (a cache, a global) is gone for the next.

Stateful tools (:mod:`rlvr.tools.registry`): a call carries its instance's pickle; the call's process unpickles it,
runs the method and pickles it back with the result (an instance that no longer pickles makes the call an error
naming its class); pickles are only ever unpickled in a call's process. :meth:`ToolPool.create` builds instances
and :meth:`ToolPool.close_instances` calls their ``close()``, each as a call with the same limits.

Network: in the ``ns-*`` modes a network namespace of the server's own, and in every mode an audit hook refusing
internet sockets (``AF_INET``/``AF_INET6``) and name lookups, so a tool that tries the network fails with
``PermissionError``/``OSError``, unless it declared ``access(network=True)``. The ``python`` tool runs code in the
``code`` verifier's sandbox on top (:mod:`rlvr_verifiers._sandbox`).
"""

from __future__ import annotations

import difflib
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

from rlvr.tools.calls import STATE_MUST_PICKLE  # noqa: F401 - re-exported: its home before the calls module
from rlvr.tools.isolation import Isolation, Server, import_paths, machine_isolation, nobody
from rlvr.tools.registry import Access, Tool, resolve_target
from rlvr.workers import ProcessPool

log = logging.getLogger("rlvr")


def call_limit(timeout_s: float) -> float:
    """The server's limit for a call under the pool's ``timeout_s``: ``timeout_s - min(0.5, timeout_s / 4)``
    seconds (so the server, not the pool's kill, ends a hung call and its processes)."""
    return timeout_s - min(0.5, 0.25 * timeout_s)


def _relay(mode: str, groups: tuple[tuple[dict[str, Any], tuple[str, ...], dict[str, str | None]], ...],
           settings: dict[str, Any]) -> Callable[[tuple], Any]:
    """A worker's handler: one :class:`~rlvr.tools.isolation.Server` per group ``(access fields, targets, env
    values)``; a job goes to the server of its target and comes back as the server's dict. A server that dies
    takes its worker with it (the pool counts the job ``crashed`` and starts a new worker)."""
    iso = Isolation(mode)
    servers: dict[str, Server] = {}
    started: list[Server] = []
    try:
        for fields, targets, env_values in groups:
            server = Server(iso, Access(**fields), targets, settings, env_values)
            started.append(server)
            servers.update({t: server for t in targets})
    except BaseException:
        for s in started:
            s.close()
        raise

    def handle(job: tuple) -> dict[str, Any]:
        try:
            return servers[job[1]].call(job)
        except (EOFError, OSError, ValueError):  # the server died (or spoke garbage): this worker goes with it
            os._exit(70)

    def close() -> None:
        for s in started:
            s.close()

    handle.close = close  # type: ignore[attr-defined] - called by the pool's worker when it stops
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
    """Runs tool calls in ``num_workers`` processes (module docstring); ``tools``: the recipe's resolved tools;
    ``isolation``: a mode of :data:`rlvr.tools.isolation.MODES` (for tests: the machine must allow it); None: the
    best this machine gives (:func:`~rlvr.tools.isolation.machine_isolation`).

    Errors: ``RuntimeError`` when a worker cannot start its servers or they cannot import the tools (the message
    holds the traceback); those of :class:`~rlvr.workers.ProcessPool` for bad sizes; ``ValueError`` for
    an unknown mode."""

    def __init__(self, tools: list[Tool], num_workers: int, timeout_s: float, max_output_chars: int,
                 memory_mb: int | None = None, *, isolation: str | None = None) -> None:
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        self.isolation = machine_isolation() if isolation is None else Isolation(isolation)
        groups: dict[Access, list[str]] = {}
        for t in tools:
            groups.setdefault(t.access, [])
            if t.target not in groups[t.access]:
                groups[t.access].append(t.target)
        if not groups:
            groups[Access()] = []
        self._log(tools)
        spec = tuple(({"network": a.network, "write": a.write, "read": a.read, "env": a.env}, tuple(ts),
                      {k: os.environ.get(k) for k in a.env}) for a, ts in groups.items())  # fmt: skip
        settings = {"call_timeout_s": call_limit(timeout_s), "max_output_chars": max_output_chars,
                    "memory_mb": memory_mb}  # fmt: skip
        self._pool = ProcessPool(_relay, (self.isolation.mode, spec, settings), num_workers, timeout_s, memory_mb,
                                 name="tool", what="the tools", preload=("rlvr.tools.execute",))  # fmt: skip

    def _log(self, tools: list[Tool]) -> None:
        """The start-up lines: the mode and what holds (in the ``ns-*`` modes with what the hidden folders show
        for the tools' imports); each tool that opened something; a warning in the plain modes (files not
        confined); a warning per tool and ``access(env=...)`` variable not set here (the tool will not see it)."""
        iso = self.isolation
        shown = import_paths({t.target: resolve_target(t.target) for t in tools}) if iso.namespaces else {}
        log.info("tools: isolation %s", iso.describe(shown=shown))
        if iso.why:
            log.info("tools: better isolation modes are not available here: %s", iso.why)
        if not iso.namespaces:
            log.warning("tools run in %s mode: %s; %s (namespaces would confine them: run as root with `unshare`, "
                        "or allow unprivileged user namespaces)", iso.mode, iso.holds()["files"],
                        iso.holds()["processes"])  # fmt: skip
        unset: set[tuple[str, str]] = set()
        for t in tools:
            if not t.access.strict:
                log.info("tool %s may also reach: %s", t.name, t.access.describe())
            for name in t.access.env:
                if name not in os.environ and (t.target, name) not in unset:  # once per tool (a class: its methods)
                    unset.add((t.target, name))
                    near = difflib.get_close_matches(name, sorted(os.environ), n=1, cutoff=0.8)
                    log.warning("tool %s: access(env=[%r]) names a variable that is not set in the trainer's "
                                "environment, so the tool will not see it%s (set it before the run, or fix the "
                                "name)", t.owner or t.name, name, f"; did you mean {near[0]!r}?" if near else "")
            if iso.drops:
                for folder in t.access.write:
                    st = os.stat(folder)
                    if st.st_uid != nobody()[0] and not st.st_mode & 0o002:
                        log.warning("tool %s: access(write=%r): tools run as nobody here, who cannot write that "
                                    "folder (chown it to nobody, or chmod o+w)", t.name, folder)

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
            status = o.value["status"] if o.ok else o.reason
            if status in ("ok", "error"):
                v = o.value
                out.append(ToolResult(tool.name, status, v["text"] if status == "ok" else f"error: {v['text']}",
                                      v["cut"], o.latency_s, v["state"] if status == "ok" else None))  # fmt: skip
            elif status == "timeout":
                out.append(ToolResult(tool.name, "timeout", f"error: {tool.name} did not finish within "
                                                            f"{self.timeout_s:g} s and was stopped", 0, o.latency_s))
            elif status == "crashed":
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
            status = o.value["status"] if o.ok else o.reason
            if status == "ok":
                out.append((o.value["state"], None))
            elif status == "error" and o.ok:
                out.append((None, o.value["text"]))
            else:
                out.append((None, {"timeout": f"did not finish within {self.timeout_s:g} s and was stopped",
                                   "crashed": "its process died"}.get(status or "", status)))  # fmt: skip
        return out

    def create(self, tools: list[Tool]) -> list[tuple[bytes | None, str | None]]:
        """One new instance of each stateful tool's class, built in a call (with the call time limit): per tool
        ``(its pickle, None)`` or ``(None, why not)`` (``__init__`` raised or timed out, the instance does not
        pickle)."""
        return self._lifecycle([("create", t.target) for t in tools])

    def close_instances(self, items: list[tuple[Tool, bytes]]) -> list[str | None]:
        """``close()`` on each ``(tool, instance pickle)``, in a call with the call time limit: per item None, or
        what went wrong (it raised, timed out or crashed). Never raises for an instance's failure."""
        return [why for _, why in self._lifecycle([("close", t.target, state) for t, state in items])]

    def stats(self) -> dict[str, int]:
        return self._pool.stats()

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> "ToolPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
