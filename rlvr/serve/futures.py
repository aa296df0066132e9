"""Futures of ``rlvr serve``: every API call that does work returns a request id at once; the work runs on a lane
(one thread per lane, calls in the order they came) and ``/api/v1/retrieve_future`` collects the result.

Every wait is bounded: a job's own calls into the roles carry deadlines (``--op-timeout-s``), a long poll waits at
most ``poll_s`` before answering "try again", and a result nobody collects is dropped after ``ttl_s``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger(__name__)


class UserError(ValueError):
    """A request the caller can fix (bad input, an unknown id): reported with category ``user``."""


@dataclass
class Result:
    """What a finished job left: ``value`` (a JSON-able dict, or protobuf bytes for proto results) or ``error``."""

    value: Any = None
    error: str | None = None
    category: str = "unknown"  # Tinker's RequestErrorCategory: "user", "server" or "unknown"
    proto: bool = False


@dataclass
class _Entry:
    kind: str
    created: float
    done: threading.Event = field(default_factory=threading.Event)
    result: Result | None = None
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=list)


class Futures:
    """Request ids -> results. ``submit(lane, kind, fn)`` runs ``fn()`` on the lane's thread (lanes are created on
    first use; jobs of one lane run one at a time, in submission order: a training model's calls keep Tinker's
    order). ``fn`` returns a :class:`Result` or a dict; a :class:`UserError` or ``ValueError`` it raises becomes a
    ``user`` failure, any other exception a ``server`` failure (logged with its traceback)."""

    def __init__(self, ttl_s: float = 3600.0) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, _Entry] = {}
        self._lanes: dict[str, cf.ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    def submit(self, lane: str, kind: str, fn: Callable[[], Any]) -> str:
        rid = self.open(kind)
        with self._lock:
            entry = self._entries[rid]
            pool = self._lanes.get(lane)
            if pool is None:
                pool = self._lanes[lane] = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"serve-{lane}")
        pool.submit(self._run, rid, entry, fn)
        return rid

    def finish(self, rid: str, result: Result) -> None:
        """Set the result of ``rid`` (jobs that finish on another thread: the sampling batcher)."""
        with self._lock:
            entry = self._entries.get(rid)
        if entry is None:
            return
        entry.result = result
        entry.done.set()
        for loop, ev in list(entry.waiters):
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:  # the poll's loop has closed: nobody is waiting there any more
                pass

    def open(self, kind: str) -> str:
        """A request id whose result :meth:`finish` will set (work done elsewhere)."""
        rid = f"{kind}-{uuid.uuid4().hex[:16]}"
        with self._lock:
            self._expire()
            self._entries[rid] = _Entry(kind, time.monotonic())
        return rid

    def drop_lane(self, lane: str) -> None:
        """Let ``lane``'s thread end once its queued jobs have run (an unloaded model's lane)."""
        with self._lock:
            pool = self._lanes.pop(lane, None)
        if pool is not None:
            pool.shutdown(wait=False)

    def _run(self, rid: str, entry: _Entry, fn: Callable[[], Any]) -> None:
        try:
            out = fn()
            result = out if isinstance(out, Result) else Result(value=out)
        except (UserError, ValueError) as e:
            log.warning("%s failed (user error): %s", rid, e)
            result = Result(error=str(e), category="user")
        except Exception as e:  # noqa: BLE001 - reported to the client, the server goes on
            log.exception("%s failed", rid)
            result = Result(error=f"{type(e).__name__}: {e}", category="server")
        self.finish(rid, result)

    async def wait(self, rid: str, poll_s: float) -> Result | None:
        """The result of ``rid`` once done, or None after ``poll_s`` seconds (the client asks again).
        Errors: ``KeyError`` for an unknown (or expired) id."""
        with self._lock:
            entry = self._entries.get(rid)
        if entry is None:
            raise KeyError(rid)
        if not entry.done.is_set() and poll_s > 0:
            ev = asyncio.Event()
            loop = asyncio.get_running_loop()
            entry.waiters.append((loop, ev))
            try:
                if not entry.done.is_set():
                    await asyncio.wait_for(ev.wait(), poll_s)
            except asyncio.TimeoutError:
                pass
            finally:
                entry.waiters.remove((loop, ev))
        return entry.result if entry.done.is_set() else None

    def _expire(self) -> None:
        """Drop finished results older than ``ttl_s`` (called under the lock)."""
        now = time.monotonic()
        old = [k for k, e in self._entries.items() if e.done.is_set() and now - e.created > self.ttl_s]
        for k in old:
            del self._entries[k]

    def pending(self) -> int:
        with self._lock:
            return sum(1 for e in self._entries.values() if not e.done.is_set())

    def close(self) -> None:
        for pool in self._lanes.values():
            pool.shutdown(wait=False, cancel_futures=True)
