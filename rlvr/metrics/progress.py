"""Console progress of a training run: a live ``rich`` bar on a terminal, one plain line per step otherwise.

Headline metrics shown (names from :mod:`rlvr.metrics.names`): ``reward/mean`` (reward), ``passk/<k>`` for the
largest k present (fraction of prompts), and ``timing/step_s`` (seconds, shown as ``step_s``).
The ETA is (steps left) x (mean seconds per step since this Progress started), so a resumed run (``start_step``)
is not credited with the steps of the earlier run.
"""

from __future__ import annotations

import sys
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
    if mn.TIMING_STEP_S in metrics:
        parts.append(f"step_s={_fmt(metrics[mn.TIMING_STEP_S], '.1f')}")
        step = to_float(metrics[mn.TIMING_STEP_S])
        idle = [(g, to_float(metrics[mn.role_idle(g)])) for g in ("engines", "trainer") if mn.role_idle(g) in metrics]
        if idle and step and step > 0:
            parts.append("idle " + " ".join(f"{g}={v / step:.0%}" for g, v in idle if v is not None))
    return " ".join(parts)


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
    :meth:`update` prints one line: ``step 3/10 | reward/mean=0.4500 passk/8=0.7500 step_s=12.3 | eta 0:01:24``.
    ``start_step``: steps already done before this process (resume). ``stream``/``clock``: for tests.
    """

    def __init__(
        self,
        total_steps: int,
        enabled: bool = True,
        *,
        start_step: int = 0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total_steps = int(total_steps)
        self.enabled = enabled
        self._stream = stream if stream is not None else sys.stdout
        self._clock = clock
        self._t0 = clock()
        self._step0 = int(start_step)
        self._live = None
        self._task = None
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
        print(line, file=self._stream, flush=True)

    def close(self) -> None:
        """Stop the live display (idempotent); plain mode has nothing to close."""
        if self._live is not None:
            self._live.stop()
            self._live = None
