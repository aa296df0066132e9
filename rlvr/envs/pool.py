"""Environments in worker processes with hard limits (:class:`~rlvr.workers.ProcessPool`, the machinery
the scoring pool uses): each ``reset`` and ``step`` call runs in a worker, with ``timeout_s`` wall-clock seconds and
``memory_mb`` of address space; the environment's state travels as its pickle (:mod:`rlvr.envs.base`), so any worker
takes any trajectory's next step and a call that hangs, crashes or raises ends only its own trajectory, with the
reason (``timeout``, ``crashed``, ``error: <ExcType>: msg``, ``bad output: ...``) on the first line of its failure
text and, after it, the traceback of an exception the environment raised (:func:`rlvr.envs.runner.failure`) or what
is known of a worker killed at its time limit or dead (:meth:`EnvPool.failure_text`).

Affinity: an environment whose class sets ``sticky = True`` keeps something in the worker that ran its reset (an
open connection: :class:`rlvr.envs.openenv.OpenEnvSession`), so its state is pinned to that worker's slot
(:data:`rlvr.envs.runner.State` ``pin``) and its steps and close run there (:meth:`rlvr.workers.ProcessPool.run`
``slots``). A worker that died or was killed at its limit is replaced by a fresh process in the same slot, which
holds nothing of it: the environment must notice (``OpenEnvSession`` raises "no live session"), which ends the
trajectory as an environment failure, never a reward.
"""

from __future__ import annotations

from typing import Any, Callable

from rlvr.envs.runner import UNPINNED, env_close, env_reset, env_step, failure, release_failures, state_pin
from rlvr.envs.tokens import Message
from rlvr.workers import ProcessPool


def _handler(imports: tuple[str, ...] = ()) -> Callable[[tuple], Any]:
    """A worker's handler: ``("reset", name, args, row)`` or ``("step", state, history, reply)`` ->
    ``(state, value)``, or ``(None, reason)`` for an environment's bug or bad output (the worker lives on);
    ``("close", state)`` -> ``(None, None)`` or ``(None, reason)``. ``imports``: modules imported first, while the
    worker starts (within the pool's start limit, not a call's: ``import verifiers`` takes 3-5 s on 2 busy cores)."""
    import importlib

    for module in imports:
        importlib.import_module(module)

    def handle(job: tuple) -> Any:
        try:
            if job[0] == "reset":
                return env_reset(job[1], job[2], job[3])
            if job[0] == "close":
                env_close(job[1])
                return None, None
            return env_step(job[1], job[2], job[3])
        except Exception as e:  # noqa: BLE001 - an environment's bug ends its trajectory, with the reason
            return None, failure(e)

    return handle


def env_preload(names: list[str | None]) -> tuple[str, ...]:
    """The modules the environments ``names`` list in their class's ``preload_modules`` (None and names that do not
    resolve are skipped: the run's own checks name those)."""
    from rlvr.envs.runner import resolve_environment

    out: list[str] = []
    for name in names:
        if name is None:
            continue
        try:
            mods = getattr(resolve_environment(name), "preload_modules", ())
        except Exception:  # noqa: BLE001 - a name that does not resolve fails at its reset, with the reason
            continue
        out += [m for m in mods if m not in out]
    return tuple(out)


class EnvPool:
    """Runs environment calls in ``num_workers`` processes (see the module docstring). Each row given to
    :meth:`reset` names its environment under ``env`` (``{"name": ..., "args": {...}}``). ``preload``: modules
    each worker imports as it starts (an environment class's ``preload_modules``: :func:`env_preload`), so that
    a slow import does not count against a call's ``timeout_s``.

    Errors: those of :class:`~rlvr.workers.ProcessPool` (bad sizes, workers that cannot start)."""

    def __init__(self, num_workers: int, timeout_s: float, memory_mb: int | None = None, *,
                 preload: tuple[str, ...] = ()) -> None:
        self._pool = ProcessPool(_handler, (tuple(preload),), num_workers, timeout_s, memory_mb, name="environment",
                                 what="the environment runner", preload=("rlvr.envs.runner", *preload))
        self._close_errors = 0

    def _run(self, jobs: list[tuple], states: list[Any] | None = None) -> list[tuple[Any, Any]]:
        """Run ``jobs``; with ``states`` (one per job), each job whose state is pinned runs in its slot. A sticky
        environment's new state (pin :data:`~rlvr.envs.runner.UNPINNED`) is pinned to the slot that ran it."""
        slots = None if states is None else [state_pin(s) for s in states]
        out = []
        for o in self._pool.run(jobs, slots):
            value = o.value if o.ok else (None, self.failure_text(o.reason))
            state = value[0]
            if state is not None and state_pin(state) == UNPINNED:
                value = ((*state[:3], o.slot), value[1])
            out.append(value)
        return out

    def failure_text(self, reason: str | None) -> str:
        """The whole text of a call the process pool ended (:attr:`rlvr.types.Completion.failure`): the reason
        (``timeout``, ``crashed``, ``error: ...``) on the first line, then what is known of it. A killed or dead
        worker sends no traceback, so it says what happened and which limit applies (the pool does not report a
        dead worker's exit code or signal)."""
        limit = "" if self._pool.memory_mb is None else f", environment.memory_mb={self._pool.memory_mb} MiB exceeded"
        detail = {
            "timeout": (f"the call ran past environment.timeout_s={self._pool.timeout_s:g} s: its worker was killed "
                        "(SIGKILL) and replaced; no traceback (the process was killed mid-call)"),
            "crashed": (f"the environment's worker process died during the call (a segfault, os._exit, the OOM "
                        f"killer{limit}) and was replaced; no traceback (the process ended before it could send one)"),
        }.get(reason or "")  # fmt: skip
        text = reason or "unknown failure"
        return text if detail is None else f"{text}\n{detail}"

    def reset(self, rows: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
        """One ``(state, opening messages)`` or ``(None, reason)`` per row, in order (a sticky environment's state
        pinned to the slot that ran its reset)."""
        return self._run([("reset", r["env"]["name"], r["env"].get("args", {}), r) for r in rows])

    def step(self, items: list[tuple[Any, list[Message], Message]]) -> list[tuple[Any, Any]]:
        """One ``(state, EnvStep)`` or ``(None, reason)`` per ``(state, history, reply)``, in order."""
        return self._run([("step", state, history, reply) for state, history, reply in items],
                         [state for state, _, _ in items])

    def release(self, states: list[Any]) -> None:
        """``close()`` each ended trajectory's environment that has one, in the workers (in parallel, the call
        limit each); a failure (raised, hung, crashed) is logged and counted in :meth:`stats` ``close_errors``,
        never raised: a trajectory's end must not fail a rollout."""
        todo = [s for s in states if s[2]]
        if not todo:
            return
        whys = [reason for _, reason in self._run([("close", s) for s in todo], todo)]
        self._close_errors += release_failures(todo, whys)

    def stats(self) -> dict[str, int]:
        """The process pool's counters: ``jobs``, ``timeouts``, ``crashes``, ``errors``, ``restarts``; and
        ``close_errors`` (environments whose ``close()`` failed)."""
        return {**self._pool.stats(), "close_errors": self._close_errors}

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
