"""What the controller is waiting on right now: each executor's ``get``/``as_completed`` opens a :class:`Wait`
(what, e.g. ``step 3: policy update``; the roles called; since when) for as long as it blocks. The progress
heartbeat (:class:`rlvr.metrics.progress.Progress`) reads it to say what a long step is waiting on."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Wait:
    """One blocking wait: ``what`` (the executor's description, e.g. ``step 3: rollout``), the ``roles`` called
    (names, in call order, each once) and ``since`` (the record's clock at its start)."""

    what: str
    roles: tuple[str, ...]
    since: float


class Waits:
    """The waits open now (thread-safe). ``clock``: seconds, monotonic (tests pass a fake one)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._open: dict[int, Wait] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    @contextmanager
    def waiting(self, what: str, roles: Iterable[str]) -> Iterator[None]:
        """Record a wait on ``roles`` for ``what`` for the body's duration."""
        key = next(self._ids)
        with self._lock:
            self._open[key] = Wait(what, tuple(dict.fromkeys(roles)), self.clock())
        try:
            yield
        finally:
            with self._lock:
                self._open.pop(key, None)

    def current(self) -> Wait | None:
        """The oldest open wait (the one the controller is blocked in; a nested one is part of it), or None."""
        with self._lock:
            return min(self._open.values(), key=lambda w: w.since, default=None)
