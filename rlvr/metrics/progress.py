"""Console progress of a training run: a live ``rich`` bar on a terminal, one plain line per step otherwise.

Headline metrics shown (names from :mod:`rlvr.metrics.names`): ``reward/mean`` (reward), ``passk/<k>`` for the
largest k present (fraction of prompts), in a multi-turn run ``rollout/turns_mean`` (``turns``) and with tools
``tools/calls_per_traj`` and ``tools/malformed_frac`` (``tool_calls``, ``malformed``), and ``timing/step_s``
(seconds, shown as ``step_s``).
The ETA is (steps left) x (mean seconds per step since :meth:`Progress.start_clock`, called when the steps begin:
the start-up, the roles' and the first validation's, is not a step's), so a resumed run (``start_step``) is not
credited with the steps of the earlier run either.

Heartbeat: on a console that is not a terminal (a log file, a pipe, CI: one line per step, nothing between), a
step that runs long prints a line every :data:`HEARTBEAT_EVERY_S` seconds without output, saying what the step
waits on and for how long (``step 3/10 running 0:02:00 | waiting 0:01:30 on policy update (trainer0)``), read
from the executor's open waits (:class:`rlvr.runtime.waits.Waits`: rollout, reward, policy update, weight sync,
...). A terminal has the live bar's clock instead.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Mapping, TextIO

from rlvr.metrics import names as mn
from rlvr.metrics.sinks import to_float


def headline(metrics: Mapping[str, Any]) -> str:
    """``"reward/mean=0.4500 passk/8=0.7500 step_s=12.3 idle engines=62% trainer=4%"`` from the metrics present
    (others are skipped); idle: ``roles/<role>_idle_s`` over the step's seconds, for the engines and the trainer."""
    parts = []
    if mn.REWARD_MEAN in metrics:
        parts.append(f"{mn.REWARD_MEAN}={_fmt(metrics[mn.REWARD_MEAN], '.4f')}")
    ks = [int(m["k"]) for key in metrics if (m := mn.parse(mn.PASSK, key))]
    if ks:
        name = mn.passk(max(ks))
        parts.append(f"{name}={_fmt(metrics[name], '.4f')}")
    if mn.ROLLOUT_TURNS_MEAN in metrics:  # multi-turn: turns per trajectory, and tool calls where tools are given
        parts.append(f"turns={_fmt(metrics[mn.ROLLOUT_TURNS_MEAN], '.2f')}")
    if mn.TOOLS_CALLS_PER_TRAJ in metrics:
        parts.append(f"tool_calls={_fmt(metrics[mn.TOOLS_CALLS_PER_TRAJ], '.2f')} "
                     f"malformed={_fmt(metrics.get(mn.TOOLS_MALFORMED_FRAC, 0.0), '.2f')}")
    if mn.TIMING_STEP_S in metrics:
        parts.append(f"step_s={_fmt(metrics[mn.TIMING_STEP_S], '.1f')}")
        step = to_float(metrics[mn.TIMING_STEP_S])
        idle = [(g, to_float(metrics[mn.role_idle(g)])) for g in ("engines", "trainer") if mn.role_idle(g) in metrics]
        if idle and step and step > 0:
            parts.append("idle " + " ".join(f"{g}={v / step:.0%}" for g, v in idle if v is not None))
    return " ".join(parts)


HEARTBEAT_EVERY_S = 60.0
"""Seconds without a line on a non-terminal console after which a running step prints a heartbeat line."""


def _fmt(value: Any, spec: str) -> str:
    f = to_float(value)
    return "nan" if f is None else format(f, spec)


def _fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-:--:--"
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """Progress over ``total_steps`` training steps.

    ``enabled=False`` prints nothing. On an interactive terminal (``rich``'s ``Console.is_interactive``) a live
    bar shows ``step M/N``, elapsed time, ETA and the headline metrics; otherwise (a log file, a pipe, CI) each
    :meth:`update` prints one line: ``step 3/10 | reward/mean=0.4500 passk/8=0.7500 step_s=12.3 | eta 0:01:24``,
    and, once :meth:`watch` has been given the executor's waits, a heartbeat line when ``heartbeat_s`` seconds
    pass without one (module docstring). ``start_step``: steps already done before this process (resume).
    ``stream``/``clock``/``heartbeat_s``: for tests (``heartbeat_s`` 0: no heartbeat).
    """

    def __init__(
        self,
        total_steps: int,
        enabled: bool = True,
        *,
        start_step: int = 0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_s: float = HEARTBEAT_EVERY_S,
    ) -> None:
        self.total_steps = int(total_steps)
        self.enabled = enabled
        self._stream = stream if stream is not None else sys.stdout
        self._clock = clock
        self._t0 = clock()
        self._step0 = int(start_step)
        self._step = int(start_step)  # the last step done
        self._stepping = False  # True from start_clock on
        self._live = None
        self._task = None
        self._heartbeat_s = heartbeat_s
        self._waits: Any = None
        self._last_line = self._step_t0 = self._t0  # when a line was last printed / the running step began
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None
        if not enabled:
            return
        from rich.console import Console

        console = Console(file=self._stream)
        if console.is_interactive:
            from rich import progress as rp

            self._live = rp.Progress(
                rp.TextColumn("[bold]step"),
                rp.MofNCompleteColumn(),
                rp.BarColumn(),
                rp.TimeElapsedColumn(),
                rp.TextColumn("eta {task.fields[eta]}"),
                rp.TextColumn("{task.fields[headline]}"),
                console=console,
            )
            self._task = self._live.add_task(
                "train", total=self.total_steps, completed=self._step0, eta=_fmt_seconds(None), headline=""
            )
            self._live.start()

    def start_clock(self) -> None:
        """The steps begin now: the ETA's pace and the first step's running time count from here (the controller
        calls it once the roles are up and the start-up's one-off work is done)."""
        self._t0 = self._step_t0 = self._last_line = self._clock()
        self._stepping = True

    def watch(self, waits: Any) -> None:
        """Report what the running step waits on, from ``waits`` (:class:`rlvr.runtime.waits.Waits`; None: the
        executor keeps no record, the line says so): in plain mode starts the heartbeat thread (:meth:`beat`
        every second or so); nothing on a terminal, when disabled or with ``heartbeat_s`` 0."""
        self._waits = waits
        if not self._stepping:
            self._step_t0 = self._last_line = self._clock()
        if not self.enabled or self._live is not None or self._heartbeat_s <= 0 or self._beater is not None:
            return
        self._beater = threading.Thread(target=self._beat_loop, name="rlvr-heartbeat", daemon=True)
        self._beater.start()

    def _beat_loop(self) -> None:
        while not self._stop.wait(min(1.0, self._heartbeat_s / 4)):
            self.beat()

    def heartbeat(self, now: float) -> str:
        """The heartbeat line at ``now`` (the clock's): the running step, its time so far, and the oldest open wait
        (what, how long, on which roles)."""
        step, took = min(self._step + 1, self.total_steps), _fmt_seconds(now - self._step_t0)
        head = (f"step {step}/{self.total_steps} running {took}" if self._stepping
                else f"before step {step}/{self.total_steps}: {took} since the roles came up")  # fmt: skip
        wait = self._waits.current() if self._waits is not None else None
        if wait is None:
            return head + " | not waiting on a role (the controller's own work: advantages, metrics, checkpoint)"
        what = wait.what.split(": ", 1)[1] if wait.what.startswith("step ") and ": " in wait.what else wait.what
        roles = ", ".join(wait.roles[:6]) + (f" and {len(wait.roles) - 6} more" if len(wait.roles) > 6 else "")
        return f"{head} | waiting {_fmt_seconds(now - wait.since)} on {what} ({roles})"

    def beat(self) -> str | None:
        """Print the heartbeat line when ``heartbeat_s`` seconds have passed since the last line; returns it."""
        with self._lock:
            now = self._clock()
            if now - self._last_line < self._heartbeat_s:
                return None
            line = self.heartbeat(now)
            self._last_line = now
            print(line, file=self._stream, flush=True)
            return line

    def eta_s(self, step: int) -> float | None:
        """Seconds left after ``step`` steps, at this session's mean pace (None before the first step)."""
        done = step - self._step0
        if done <= 0:
            return None
        return (self._clock() - self._t0) / done * max(self.total_steps - step, 0)

    def update(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record that ``step`` steps are complete (1-based: the step just finished) with its metrics."""
        if not self.enabled:
            return
        eta = _fmt_seconds(self.eta_s(step))
        text = headline(metrics)
        if self._live is not None:
            self._live.update(self._task, completed=step, eta=eta, headline=text)
            return
        line = f"step {step}/{self.total_steps}" + (f" | {text}" if text else "") + f" | eta {eta}"
        with self._lock:
            self._step = step
            self._step_t0 = self._last_line = self._clock()
            print(line, file=self._stream, flush=True)

    def close(self) -> None:
        """Stop the live display and the heartbeat (idempotent)."""
        self._stop.set()
        if self._beater is not None:
            self._beater.join(timeout=5)
            self._beater = None
        if self._live is not None:
            self._live.stop()
            self._live = None
