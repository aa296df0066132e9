"""Fault injection for chaos runs (issue 41): an executor wrapper that kills a role's process, or stops the
controller, at a chosen call of a chosen role, so that a run's recovery can be tested end to end and timed.

A :class:`Fault` names a role (``engine0``, ``trainer0``, ``reward``, ...), one of its methods and which call of it
(the n-th over the whole chaos run, restarts included: a :class:`Chaos` plan outlives the executors of a run's
attempts), and what happens right after that call is submitted: ``kill`` (the role's Ray actor is killed, as a lost
node or the OOM killer would: the call in flight fails as a death), ``sigterm`` (this process receives SIGTERM, as
from a scheduler), or ``touch`` (a file is created: a verifier or environment of the run that watches it can then
fail from inside, e.g. kill its own worker process). ``delay_s`` > 0 does it that many seconds later instead, on a
timer (a kill in the middle of the call rather than before it starts).

Usage (the Ray executor; a role of the local executor cannot be killed)::

    plan = Chaos([Fault("engine0", "generate", 2, "kill"), Fault("trainer0", "train_step", 4, "kill")])
    train_with_restarts(recipe, run_dir, executors=lambda: plan.wrap(default_executor(recipe, run_dir)))

``plan.log`` keeps, per fault, when it fired (``time.time()``), to time detection and recovery from the run's
logs (``benchmarks/chaos.py``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlvr.runtime.executors import Handle

log = logging.getLogger(__name__)


@dataclass
class Fault:
    """Right after the ``nth`` call (1-based, counted over the whole chaos run) of ``role``.``method`` is
    submitted, do ``action`` (``delay_s`` seconds later when > 0): ``kill`` the role's process, ``sigterm`` this
    process, ``touch`` the file ``path``. ``fired_at``: when it was done (``time.time()``), None until then."""

    role: str
    method: str
    nth: int
    action: Literal["kill", "sigterm", "touch"] = "kill"
    delay_s: float = 0.0
    path: str | None = None
    fired_at: float | None = None

    def __post_init__(self) -> None:
        if self.nth < 1:
            raise ValueError(f"Fault({self.role}.{self.method}): nth={self.nth} must be >= 1 (the 1st call is 1)")
        if self.action == "touch" and not self.path:
            raise ValueError(f"Fault({self.role}.{self.method}, touch) needs path=")
        if self.action not in ("kill", "sigterm", "touch"):
            raise ValueError(f"Fault action {self.action!r}: one of kill, sigterm, touch")


@dataclass
class Chaos:
    """A plan of :class:`Fault` s and the count of every role's calls so far (``calls[(role, method)]``)."""

    faults: list[Fault]
    calls: dict[tuple[str, str], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def wrap(self, executor: Any) -> "ChaosExecutor":
        """``executor`` (a :class:`~rlvr.runtime.executors.RayExecutor`) whose roles' calls this plan watches."""
        return ChaosExecutor(executor, self)

    def called(self, executor: Any, handle: Handle, method: str) -> None:
        """Count a call just submitted and fire the faults it is due for."""
        with self._lock:
            key = (handle.name, method)
            n = self.calls[key] = self.calls.get(key, 0) + 1
            due = [f for f in self.faults if f.fired_at is None and (f.role, f.method, f.nth) == (*key, n)]
            for f in due:
                f.fired_at = -1.0  # claimed
        for f in due:
            if f.delay_s > 0:
                threading.Timer(f.delay_s, self._fire, (executor, handle, f)).start()
            else:
                self._fire(executor, handle, f)

    def _fire(self, executor: Any, handle: Handle, f: Fault) -> None:
        f.fired_at = time.time()
        log.warning("chaos: %s after call %d of %s.%s", f.action, f.nth, f.role, f.method)
        if f.action == "kill":
            executor.kill(handle)
        elif f.action == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            Path(str(f.path)).touch()


class _ChaosHandle(Handle):
    def __init__(self, inner: Handle, ex: Any, plan: Chaos):
        super().__init__(inner.name, inner._target, ex)
        self._plan, self._inner_ex = plan, ex

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        c = super().call(method, *args, **kwargs)
        self._plan.called(self._inner_ex, self, method)
        return c


class ChaosExecutor:
    """An executor whose roles' calls a :class:`Chaos` plan watches; everything else is the wrapped executor's."""

    def __init__(self, inner: Any, plan: Chaos):
        self._inner, self._plan = inner, plan

    def spawn(self, name: str, cls: type, *args: Any, **kwargs: Any) -> Handle:
        return _ChaosHandle(self._inner.spawn(name, cls, *args, **kwargs), self._inner, self._plan)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
