"""Untrusted code in worker processes with a hard wall-clock limit per job: the home of what the scoring pool
(verifiers, :mod:`rlvr.reward.pool`), the environment pool (:mod:`rlvr.envs.pool`) and the tool calls
(:mod:`rlvr.tools.execute`) share. This module imports nothing of rlvr: the reward, environment and tool layers all
stand on it (as on :mod:`rlvr.userfiles`).

Model output and user plug-ins are untrusted: a call can hang (math-verify on towers of powers), exhaust memory or
kill its process. So each job runs in a worker process (a ``multiprocessing`` forkserver context where the platform
has one, else spawn; never threads: math-verify relies on ``signal.alarm``, which only works on a main thread, and a
hung thread cannot be killed). Each worker calls ``init(*init_args)`` once to build its handler; the parent sends one
job at a time to each idle worker and waits for all of them with one ``multiprocessing.connection.wait``.

A job may be pinned to a worker slot (``run(jobs, slots)``; slot ``k`` is the ``k``-th worker, and its
replacement after a death keeps the slot): it waits for that slot's worker, which takes pinned jobs before free
ones. That is worker affinity, for a job whose handler keeps something alive in its process between jobs (an open
connection): the later jobs of the same work go to the slot that ran the first (:attr:`Outcome.slot`). A replaced
worker is a fresh process that holds nothing of its predecessor: the handler must notice that itself.

Per job exactly one :class:`Outcome` comes back, in input order, always:

- a worker still busy ``timeout_s`` seconds after the job was sent is killed (SIGKILL) and replaced: ``timeout``;
- a worker that dies on a job (a segfault, ``os._exit``, the OOM killer, ``memory_mb`` exceeded) is replaced:
  ``crashed``;
- a handler that raises: ``error: <ExcType>: msg`` (the worker lives on); a job that does not pickle: the same.

A replacement worker's start-up is not counted against any job's limit. Workers end with the pool's process, even
when it is killed while one of them hangs. The pool works inside a Ray actor (forkserver and spawn start a fresh
interpreter); the module the host process runs as ``__main__`` is imported by the workers as ``__mp_main__``, so
scripts need a ``__main__`` guard.
"""

from __future__ import annotations

import collections
import math
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import signal
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

START_TIMEOUT_S = 120.0
"""A worker that has not built its handler within this many seconds fails the pool (``RuntimeError``)."""
_MAX_START_FAILURES = 3
KILL_REAP_S = 5.0
"""Seconds to reap a worker after SIGKILL (the kernel ends it at once; not a wait on work, so not a recipe field:
a job's own deadline is the pool's ``timeout_s``)."""


@dataclass(frozen=True)
class Outcome:
    """One job's result: ``value`` (the handler's return) when ``reason`` is None; else ``reason`` is
    ``timeout``, ``crashed`` or ``error: <ExcType>: msg``. ``latency_s``: seconds from sending to the answer.
    ``slot``: the worker slot that ran it (``0..num_workers-1``; None for a job that never reached a worker)."""

    value: Any
    reason: str | None
    latency_s: float
    slot: int | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


def error_reason(exc: BaseException) -> str:
    """``error: <ExcType>: msg`` (the message capped at 300 characters)."""
    return f"error: {type(exc).__name__}: {str(exc)[:300]}"


def _exit_with_parent(name: str) -> None:
    """A daemon thread that ends this worker when the pool's process dies, even mid-job: it waits on
    ``multiprocessing.parent_process().sentinel``, a pipe whose write end only the pool's process holds (under
    forkserver too, where the OS parent is the fork server)."""
    parent = mp.parent_process()
    sentinel = getattr(parent, "sentinel", None)
    if sentinel is None:
        return

    def watch() -> None:
        mp_connection.wait([sentinel])
        os._exit(0)

    threading.Thread(target=watch, name=f"{name}-watchdog", daemon=True).start()


def _worker_main(conn: Any, init: Callable[..., Callable[[Any], Any]], init_args: tuple, memory_mb: int | None,
                 name: str) -> None:
    """Body of a worker: ``handler = init(*init_args)``, then answer jobs until ``None`` or the parent goes away,
    then ``handler.close()`` when the handler has one (not when the worker is killed). Replies ``("ready",)``,
    ``("init_error", traceback)``, ``("result", value)`` or ``("error", reason)``."""
    _exit_with_parent(name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        handler = init(*init_args)
        if memory_mb is not None:
            import resource

            limit = memory_mb * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("init_error", traceback.format_exc()))
        return
    conn.send(("ready",))
    try:
        while True:
            try:
                job = conn.recv()
            except (EOFError, OSError):
                return
            if job is None:
                return
            try:
                value = handler(job)
            except Exception as e:  # noqa: BLE001 - a plug-in's bug costs its job, with a reason
                conn.send(("error", error_reason(e)))
                continue
            try:
                conn.send(("result", value))
            except Exception as e:  # noqa: BLE001 - a value that does not pickle
                conn.send(("error", error_reason(e)))
    finally:
        close = getattr(handler, "close", None)
        if callable(close):
            close()


@dataclass(eq=False)
class _Worker:
    proc: Any
    conn: Any
    started_at: float
    ready: bool = False
    job: int | None = None
    sent_at: float = 0.0
    deadline: float = math.inf


def _kill_all(workers: list[_Worker]) -> None:
    for w in workers:
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join(timeout=KILL_REAP_S)
        w.conn.close()
    workers.clear()


def default_start_method() -> str:
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


class ProcessPool:
    """Runs jobs in ``num_workers`` processes (see the module docstring).

    Args:
        init: a module-level function (it is pickled by reference) returning the handler ``job -> value``;
            called once per worker with ``init_args``.
        num_workers: worker processes (each runs one job at a time).
        timeout_s: hard wall-clock limit per job, in seconds.
        memory_mb: address-space limit per worker (``RLIMIT_AS``, MiB), set after ``init``; None: no limit.
        name: the workers' process name, and what error messages call them (``scoring``, ``environment``).
        what: what ``init`` builds, for error messages (``its verifiers``).
        preload: modules imported once in the fork server (by the first pool of a process), so a replacement
            worker starts in milliseconds.
        start_method: ``forkserver`` (default where available) or ``spawn``.

    Errors: ``ValueError`` for non-positive sizes; ``RuntimeError`` when a worker cannot run ``init`` (the message
    holds its traceback) or workers keep dying before they are ready.
    """

    def __init__(self, init: Callable[..., Callable[[Any], Any]], init_args: tuple, num_workers: int,
                 timeout_s: float, memory_mb: int | None = None, *, name: str = "worker", what: str = "its handler",
                 preload: Sequence[str] = (), start_method: str | None = None) -> None:
        if num_workers < 1 or not timeout_s > 0 or (memory_mb is not None and memory_mb < 1):
            raise ValueError(f"a {name} pool needs num_workers >= 1, timeout_s > 0, memory_mb None or >= 1; got "
                             f"{num_workers}, {timeout_s}, {memory_mb}")
        self._init, self._init_args = init, tuple(init_args)
        self.timeout_s, self.memory_mb, self.name, self.what = float(timeout_s), memory_mb, name, what
        self._ctx = mp.get_context(start_method or default_start_method())
        if self._ctx.get_start_method() == "forkserver":
            self._ctx.set_forkserver_preload(["rlvr.workers", *preload])
        self._stats: collections.Counter[str] = collections.Counter()
        self._start_failures = 0
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)
        try:
            for _ in range(num_workers):
                self._workers.append(self._start())
            while not all(w.ready for w in self._workers):
                self._wait_and_service([])
        except BaseException:
            self.close()
            raise

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    def run(self, jobs: Sequence[Any], slots: Sequence[int | None] | None = None) -> list[Outcome]:
        """``[N]`` :class:`Outcome`, in input order, one per job whatever happens to the workers.

        ``slots``: None (any worker runs any job), or ``[N]``: per job None (any worker) or the slot
        (``0..num_workers-1``) of the worker that must run it; a pinned job waits for its slot (the slot's worker
        takes its pinned jobs first, in input order), also when that worker was replaced.

        Errors: ``ValueError`` for ``slots`` of another length or a slot out of range; ``RuntimeError`` on a closed
        pool or when replacement workers cannot start."""
        if not self._finalizer.alive:
            raise RuntimeError(f"the {self.name} pool was used after close()")
        if slots is not None and len(slots) != len(jobs):
            raise ValueError(f"{self.name} pool: {len(slots)} slots for {len(jobs)} jobs; give one per job "
                             "(None: any worker)")
        n = len(self._workers)
        bad = [k for k in (slots or ()) if k is not None and not (isinstance(k, int) and 0 <= k < n)]
        if bad:
            raise ValueError(f"{self.name} pool: slot {bad[0]!r} is not a worker of this pool (slots 0..{n - 1}); "
                             "pin a job to the Outcome.slot of an earlier job, or None for any worker")
        out: list[Outcome | None] = [None] * len(jobs)
        free: collections.deque[int] = collections.deque()
        pinned: list[collections.deque[int]] = [collections.deque() for _ in range(n)]
        for i in range(len(jobs)):
            k = None if slots is None else slots[i]
            (free if k is None else pinned[k]).append(i)
        while free or any(pinned) or any(w.job is not None for w in self._workers):
            for k, w in enumerate(self._workers):
                if w.ready and w.job is None and (pinned[k] or free):
                    self._dispatch(k, w, pinned[k] or free, out, jobs)
            if free or any(pinned) or any(w.job is not None for w in self._workers):
                self._wait_and_service(out)
        self._stats["jobs"] += len(jobs)
        return [o for o in out if o is not None]

    def stats(self) -> dict[str, int]:
        """Counters since the pool started: ``jobs``, ``timeouts``, ``crashes``, ``errors`` (jobs whose handler
        raised), ``restarts`` (workers replaced)."""
        return {k: int(self._stats[k]) for k in ("jobs", "timeouts", "crashes", "errors", "restarts")}

    def close(self) -> None:
        """Stop the workers (politely, then SIGKILL after 2 s). Idempotent."""
        for w in self._workers:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        end = time.monotonic() + 2.0
        for w in self._workers:
            w.proc.join(timeout=max(0.0, end - time.monotonic()))
        self._finalizer()

    # -- internals ---------------------------------------------------------------------------------------
    def _start(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_worker_main, name=f"rlvr-{self.name}", daemon=True,
                                 args=(child_conn, self._init, self._init_args, self.memory_mb, f"rlvr-{self.name}"))
        proc.start()
        child_conn.close()
        return _Worker(proc=proc, conn=parent_conn, started_at=time.monotonic())

    def _replace(self, w: _Worker) -> None:
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join(timeout=KILL_REAP_S)
        w.conn.close()
        self._workers[self._workers.index(w)] = self._start()
        self._stats["restarts"] += 1

    def _dispatch(self, slot: int, w: _Worker, queue: collections.deque[int], out: list[Outcome | None],
                  jobs: Sequence[Any]) -> None:
        index = queue.popleft()
        try:
            w.conn.send(jobs[index])
        except (BrokenPipeError, ConnectionError, EOFError):  # died while idle: not this job's fault
            queue.appendleft(index)
            self._replace(w)
            return
        except Exception as e:  # noqa: BLE001 - e.g. a job that does not pickle
            out[index] = Outcome(None, error_reason(e), 0.0, slot)
            self._stats["errors"] += 1
            return
        w.job, w.sent_at = index, time.monotonic()
        w.deadline = w.sent_at + self.timeout_s

    def _wait_and_service(self, out: list[Outcome | None]) -> None:
        """Wait for a message, a death or the next deadline, then handle every worker once."""
        now = time.monotonic()
        waitables: list[Any] = []
        wake = now + 1.0
        for w in self._workers:
            if w.job is not None or not w.ready:
                waitables += [w.conn, w.proc.sentinel]
                wake = min(wake, w.deadline if w.ready else w.started_at + START_TIMEOUT_S)
        if waitables:
            mp_connection.wait(waitables, timeout=max(0.0, wake - now))
        for w in list(self._workers):
            self._service(w, out)

    def _finish(self, w: _Worker, out: list[Outcome | None], value: Any, reason: str | None) -> None:
        out[w.job] = Outcome(value, reason, time.monotonic() - w.sent_at, self._workers.index(w))
        w.job, w.deadline = None, math.inf

    def _service(self, w: _Worker, out: list[Outcome | None]) -> None:
        dead = False
        try:
            while w.conn.poll():
                msg = w.conn.recv()
                if msg[0] == "ready":
                    w.ready, self._start_failures = True, 0
                elif msg[0] == "init_error":
                    raise RuntimeError(f"a {self.name} worker could not build {self.what}:\n{msg[1]}")
                elif msg[0] == "result" and w.job is not None:
                    self._finish(w, out, msg[1], None)
                elif msg[0] == "error" and w.job is not None:
                    self._stats["errors"] += 1
                    self._finish(w, out, None, msg[1])
        except (EOFError, OSError):
            dead = True
        now = time.monotonic()
        if dead or not w.proc.is_alive():
            if w.job is not None:
                self._finish(w, out, None, "crashed")
                self._stats["crashes"] += 1
            elif not w.ready:
                self._start_failures += 1
                if self._start_failures >= _MAX_START_FAILURES:
                    raise RuntimeError(
                        f"{self.name} workers keep dying before they are ready (last exit code {w.proc.exitcode}). "
                        "If rlvr runs inside a Python script of your own (run.executor=local), put its calls under "
                        "`if __name__ == '__main__':` - worker processes import your main module, as every "
                        f"multiprocessing 'spawn'/'forkserver' child does; otherwise see the import errors of "
                        f"{self.what} above")  # fmt: skip
            self._replace(w)
        elif w.job is not None and now >= w.deadline:
            self._finish(w, out, None, "timeout")
            self._stats["timeouts"] += 1
            self._replace(w)
        elif not w.ready and now - w.started_at > START_TIMEOUT_S:
            raise RuntimeError(f"a {self.name} worker did not build {self.what} within {START_TIMEOUT_S:.0f} s")
