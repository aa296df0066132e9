"""``rlvr plot RUN_DIR [--out DIR]``: PNG figures of a run's ``RUN/metrics.jsonl``.

One PNG per panel (``reward.png``, ``passk.png`` ...; see :data:`PANELS`) and ``overview.png`` with every panel
in a grid, written to ``--out`` (default ``RUN/plots``); with ``RUN/timeline.jsonl``, ``timeline.png``: each
role's calls over the last ``--timeline-steps`` steps (:func:`plot_timeline`). A panel none of whose metrics are in the file is
skipped (the console says so); the paths written are printed. x is the training step (validation at step 0 is
the starting policy). Rendering uses matplotlib's Agg canvas (no display, no ``pyplot`` state).

Exit status: 0 when at least one figure was written; 1 when the file has no metric any panel plots; 2 for a
missing or unreadable file, or matplotlib not installed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from rlvr.metrics import names as mn

PANEL_SIZE_IN = (6.0, 3.5)
"""Width, height (inches) of a one-panel figure; at :data:`DPI` a PNG of 600 x 350 pixels."""
DPI = 100
OVERVIEW_COLS = 3


@dataclass(frozen=True)
class Panel:
    """One plot: the metrics whose names match ``pattern`` (a regex, full match), one line each."""

    slug: str
    title: str
    pattern: str
    ylabel: str


def _any(*patterns: str) -> str:
    """A regex (full match) of any of the metric names or catalogue patterns (:func:`rlvr.metrics.names.regex`)."""
    return mn.regex(patterns[0]) if len(patterns) == 1 else "|".join(f"(?:{mn.regex(p)})" for p in patterns)


PANELS: tuple[Panel, ...] = (
    Panel("reward", "reward", _any(mn.REWARD_MEAN, mn.REWARD_CORRECT_FRAC), "reward"),
    Panel("passk", "train pass@k", _any(mn.PASSK), "fraction of prompts"),
    Panel("val", "validation", _any(mn.VAL_PASS, mn.VAL_MAJ, mn.VAL_MEAN), "fraction"),
    Panel("length", "response length", _any(mn.RESPONSE_LENGTH_MEAN, mn.RESPONSE_LENGTH_MAX, mn.VAL_LENGTH_MEAN), "tokens"),
    Panel("kl", "KL", _any(mn.TRAIN_KL, mn.TRAIN_ROLLOUT_KL_K3, mn.TRAIN_APPROX_KL), "nats"),
    Panel("entropy", "entropy", _any(mn.TRAIN_ENTROPY), "nats per token"),
    # train/clip_frac: no built-in loss logs it (theirs are train/clipped*); kept for a user loss's stat of that name
    Panel("clip", "clip fraction",
          _any(mn.train_stat("clip_frac"), mn.train_stat("clipped<suffix>"), mn.TRAIN_TIS_CAPPED), "fraction of tokens"),
    Panel("rollout_gap", "rollout vs trainer logprobs |old - rollout|",
          _any(mn.TRAIN_ROLLOUT_GAP_ABS, mn.TRAIN_ROLLOUT_GAP_ABS_MAX), "nats"),
    Panel("timing", "time per stage", _any(mn.TIMING), "seconds"),
    Panel("sync", "weight sync", _any(mn.SYNC_GBPS), "GB/s"),
    Panel("idle", "idle seconds per role", _any(mn.ROLE_IDLE), "seconds"),
    Panel("staleness", "policy lag of the trained samples", _any(mn.ASYNC_STALENESS_MEAN, mn.ASYNC_STALENESS_MAX), "versions"),
    Panel("distill", "reverse KL to the teacher (on-policy distillation)",
          _any(mn.DISTILL_REVERSE_KL_MEAN, mn.DISTILL_REVERSE_KL_SEQ_MEAN), "nats per token"),
    # multi-turn trajectories (an environment or tools) and tools: drawn only for runs that log them
    Panel("turns", "multi-turn: assistant turns per trajectory", _any(mn.ROLLOUT_TURNS_MEAN), "turns (mean)"),
    Panel("trajectory_ends", "multi-turn: solved after turn 1, failed, cut",
          # rollout/excluded_frac is left out: every exclusion is an environment failure today, so its line
          # would hide under rollout/env_failed_frac's
          _any(mn.ROLLOUT_SOLVED_AFTER_TURN_1, mn.ROLLOUT_ENV_FAILED_FRAC,
               mn.ROLLOUT_PREFIX_BROKEN_FRAC, mn.ROLLOUT_BUDGET_END_FRAC, mn.ROLLOUT_LENGTH_END_FRAC,
               mn.ROLLOUT_STOP_ID_END_FRAC), "fraction of trajectories"),
    Panel("tools", "tool calls per trajectory, malformed share",
          _any(mn.TOOLS_CALLS_PER_TRAJ, mn.TOOLS_MALFORMED_FRAC), "calls (malformed: fraction of calls)"),
    Panel("tool_outcomes", "tool call outcomes",
          _any(*(mn.tool_outcome("<tool>", o) for o in mn.TOOL_CALL_OUTCOMES)), "calls in the step"),
)  # fmt: skip
"""The panels, in the order of the overview grid; patterns built from :mod:`rlvr.metrics.names`. A panel none of
whose metrics a run logged is skipped (a single-turn run has no multi-turn or tool panels)."""


def read_metrics(path: str | Path) -> tuple[dict[str, dict[int, float]], int]:
    """Series of a ``metrics.jsonl``: ``{name: {step: value}}`` (``null`` values left out) and the count of
    lines skipped (blank, not JSON, not an object, no integer ``step``: e.g. a half-written last line of a
    crashed run). A step logged twice (a resumed run appends) keeps its last value.

    Errors: ``OSError`` when the file cannot be read.
    """
    series: dict[str, dict[int, float]] = {}
    bad = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                bad += 1
                continue
            step = row["step"]
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    series.setdefault(key, {})[step] = float(value)
    return series, bad


def _sort_key(name: str) -> tuple:
    """Natural order: ``passk/2`` before ``passk/16``."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def panel_metrics(panel: Panel, series: dict[str, dict[int, float]]) -> list[str]:
    """Names in ``series`` that ``panel`` plots, in natural order."""
    rx = re.compile(panel.pattern)
    return sorted((k for k in series if rx.fullmatch(k) and series[k]), key=_sort_key)


def _draw(ax: Any, panel: Panel, names: list[str], series: dict[str, dict[int, float]]) -> None:
    from matplotlib.ticker import MaxNLocator

    for name in names:
        pts = sorted(series[name].items())
        xs = [s for s, _ in pts]
        ys = [v if math.isfinite(v) else float("nan") for _, v in pts]
        ax.plot(xs, ys, marker="o" if len(xs) <= 20 else None, markersize=3, linewidth=1.4, label=name)
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.legend(fontsize=6, loc="best", ncol=2 if len(names) > 4 else 1)


def _save(fig: Any, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI)


def plot_run(metrics_path: str | Path, out_dir: str | Path) -> tuple[list[Path], list[str]]:
    """Write the figures of ``metrics_path`` into ``out_dir`` (created if missing).

    Returns (paths written: one PNG per panel with data, in :data:`PANELS` order, then ``overview.png``;
    titles of the panels skipped for want of data). Nothing is written when no panel has data.
    Errors: ``OSError`` for an unreadable file; ``ImportError`` naming the pip package without matplotlib.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("rlvr plot needs matplotlib: pip install 'rlvr[logging]' (or pip install matplotlib)") from e
    series, _ = read_metrics(metrics_path)
    todo = [(p, names) for p in PANELS if (names := panel_metrics(p, series))]
    skipped = [p.title for p in PANELS if not panel_metrics(p, series)]
    if not todo:
        return [], skipped
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for panel, names in todo:
        fig = Figure(figsize=PANEL_SIZE_IN, layout="constrained")
        _draw(fig.add_subplot(), panel, names, series)
        path = out / f"{panel.slug}.png"
        _save(fig, path)
        written.append(path)
    cols = min(OVERVIEW_COLS, len(todo))
    rows = math.ceil(len(todo) / cols)
    fig = Figure(figsize=(PANEL_SIZE_IN[0] * cols, PANEL_SIZE_IN[1] * rows), layout="constrained")
    fig.suptitle(f"{Path(metrics_path).parent.name}: {Path(metrics_path).name}", fontsize=11)
    for i, (panel, names) in enumerate(todo):
        _draw(fig.add_subplot(rows, cols, i + 1), panel, names, series)
    path = out / "overview.png"
    _save(fig, path)
    written.append(path)
    return written, skipped


TIMELINE_STEPS = 4
"""Steps the timeline figure shows by default (the last ones of the run)."""
_METHOD_COLOURS = {"generate": "tab:blue", "score": "tab:orange", "train_step": "tab:green",
                   "compute_logprobs": "tab:olive", "compute_values": "tab:cyan", "send_weights": "tab:red",
                   "receive_weights": "tab:red", "probe_logprobs": "tab:purple", "judge_with_text": "tab:brown"}  # fmt: skip


def plot_timeline(timeline_path: str | Path, out_dir: str | Path, steps: int = TIMELINE_STEPS) -> Path | None:
    """``timeline.png``: a row per role (engines, reward, judge, trainer ranks, critic), a bar per call the role ran
    over the run's last ``steps`` steps (colour: the method; sync in red), dashed lines at step boundaries: the
    pipeline picture that shows where each role waits. Returns the path, or None when the file has no step.
    Errors: ``OSError`` for an unreadable file; ``ImportError`` without matplotlib."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from rlvr.metrics.timeline import group_order, read_timeline

    rows = read_timeline(timeline_path)[-steps:]
    if not rows:
        return None
    spans = [s for r in rows for s in r["spans"]]
    roles = sorted({s[0] for s in spans}, key=group_order)
    fig = Figure(figsize=(10.0, 0.6 * len(roles) + 1.6), layout="constrained")
    ax = fig.add_subplot()
    for y, role in enumerate(roles):
        for _, method, a, b in (s for s in spans if s[0] == role):
            ax.broken_barh([(a, max(b - a, 1e-3))], (y - 0.35, 0.7), color=_METHOD_COLOURS.get(method, "tab:gray"))
    for r in rows:
        ax.axvline(r["start"], color="black", linestyle="--", linewidth=0.6)
        ax.text(r["start"], len(roles) - 0.4, f" step {r['step']}", fontsize=7, va="bottom")
    ax.set_yticks(range(len(roles)), roles, fontsize=8)
    ax.set_xlabel("seconds since the first step began", fontsize=8)
    ax.set_ylim(-0.6, len(roles) + 0.2)
    ax.invert_yaxis()
    ax.tick_params(labelsize=7)
    shown = sorted({s[1] for s in spans}, key=lambda m: list(_METHOD_COLOURS).index(m) if m in _METHOD_COLOURS else 99)
    ax.legend(handles=[Patch(color=_METHOD_COLOURS.get(m, "tab:gray"), label=m) for m in shown], fontsize=7,
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=min(len(shown), 7))  # fmt: skip
    ax.set_title(f"{Path(timeline_path).parent.name}: what each role did, steps {rows[0]['step']}-{rows[-1]['step']}",
                 fontsize=10)  # fmt: skip
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "timeline.png"
    _save(fig, path)
    return path


def add_plot_parser(sub: Any) -> None:
    """Register the ``plot`` subcommand on an ``argparse`` subparsers object (see :func:`cmd_plot`)."""
    p = sub.add_parser("plot", help="plot a run's metrics.jsonl to PNG files")
    p.add_argument("run_dir", help="run folder (holding metrics.jsonl), or a metrics.jsonl file")
    p.add_argument("--out", default=None, help="folder for the PNGs (default: RUN_DIR/plots)")
    p.add_argument("--timeline-steps", type=int, default=TIMELINE_STEPS,
                   help=f"steps timeline.png shows, the run's last (default {TIMELINE_STEPS})")
    p.set_defaults(fn=cmd_plot)


def cmd_plot(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    """Run ``rlvr plot``; prints skipped panels and the paths written to ``stream`` (default stdout), errors to
    stderr. Returns the exit status (module docstring)."""
    out_stream = stream if stream is not None else sys.stdout
    target = Path(args.run_dir)
    metrics_path = target if target.is_file() else target / "metrics.jsonl"
    out_dir = Path(args.out) if args.out else metrics_path.parent / "plots"
    if not metrics_path.is_file():
        print(f"rlvr plot: no metrics file at {metrics_path}", file=sys.stderr)
        return 2
    try:
        _, bad = read_metrics(metrics_path)
        written, skipped = plot_run(metrics_path, out_dir)
        timeline = metrics_path.parent / "timeline.jsonl"
        if written and timeline.is_file():
            t = plot_timeline(timeline, out_dir, getattr(args, "timeline_steps", TIMELINE_STEPS))
            written += [t] if t is not None else []
    except (OSError, UnicodeDecodeError, ImportError, ValueError) as e:  # ValueError: a damaged timeline.jsonl
        print(f"rlvr plot: {e}", file=sys.stderr)
        return 2
    if bad:
        print(f"skipped {bad} unreadable line(s) of {metrics_path}", file=out_stream)
    for title in skipped:
        print(f"skipped panel '{title}': none of its metrics are in {metrics_path.name}", file=out_stream)
    if not written:
        print(f"rlvr plot: nothing to plot in {metrics_path}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}", file=out_stream)
    return 0
