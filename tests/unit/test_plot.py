"""``rlvr plot``: reading metrics.jsonl, choosing panels, and the PNGs written (size, not blank)."""

from __future__ import annotations

import io
import json
import math
import sys

import pytest

from rlvr.cli import main
from rlvr.plot import PANELS, cmd_plot, panel_metrics, plot_run, read_metrics

ROWS = [
    {"step": 0, "val/pass@1": 0.1, "val/pass@4": 0.3, "val/maj@4": 0.2, "val/length_mean": 40.0},
    {"step": 1, "reward/mean": 0.2, "passk/1": 0.2, "passk/16": 0.6, "passk/2": 0.3, "response/length_mean": 50.0,
     "response/length_max": 64.0, "train/entropy": 2.5, "timing/rollout_s": 3.0, "timing/step_s": 5.0,
     "sync/gbps": 1.1, "policy_version": 1.0},
    {"step": 2, "reward/mean": 0.4, "passk/1": 0.4, "passk/16": 0.8, "passk/2": 0.5, "response/length_mean": 45.0,
     "response/length_max": 64.0, "train/entropy": None, "timing/rollout_s": 2.5, "timing/step_s": 4.5,
     "sync/gbps": 1.3, "policy_version": 2.0},
]


def _write(path, rows, tail=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def test_read_metrics_series_resume_and_bad_lines(tmp_path):
    # a resumed run re-logged step 2 (last value wins); a crash left half a line; a blank line; a non-object
    extra = [{"step": 2, "reward/mean": 0.45}, {"step": 3, "reward/mean": 0.5, "flag": True}]
    path = _write(tmp_path / "m.jsonl", ROWS + extra, tail='\n[1, 2]\n{"step": 4, "reward/me')
    series, bad = read_metrics(path)
    assert bad == 2
    assert series["reward/mean"] == {1: 0.2, 2: 0.45, 3: 0.5}
    assert series["train/entropy"] == {1: 2.5}  # null left out
    assert series["val/pass@4"] == {0: 0.3}
    assert "flag" not in series  # bools are not metrics


def test_panel_selection_natural_order(tmp_path):
    series, _ = read_metrics(_write(tmp_path / "m.jsonl", ROWS))
    by_slug = {p.slug: panel_metrics(p, series) for p in PANELS}
    assert by_slug["passk"] == ["passk/1", "passk/2", "passk/16"]
    assert by_slug["val"] == ["val/maj@4", "val/pass@1", "val/pass@4"]
    assert by_slug["length"] == ["response/length_max", "response/length_mean", "val/length_mean"]
    assert by_slug["timing"] == ["timing/rollout_s", "timing/step_s"]
    assert by_slug["kl"] == [] and by_slug["clip"] == [] and by_slug["rollout_gap"] == [] and by_slug["distill"] == []
    distill = {"distill/reverse_kl_mean": {1: 0.4}, "distill/reverse_kl_seq_mean": {1: 0.5},
               "distill/clipped_frac": {1: 0.0}, "timing/teacher_s": {1: 3.0}, "timing/teacher_share": {1: 0.2}}
    assert panel_metrics(next(p for p in PANELS if p.slug == "distill"), distill) == [
        "distill/reverse_kl_mean", "distill/reverse_kl_seq_mean"]
    assert panel_metrics(next(p for p in PANELS if p.slug == "timing"), distill) == ["timing/teacher_s"]
    assert panel_metrics(next(p for p in PANELS if p.slug == "clip"),
                         {"train/clipped_high": {1: 0.1}, "train/clip_frac": {1: 0.2}, "train/clipped": {}}) == [
        "train/clip_frac", "train/clipped_high"]


def test_plot_run_writes_sized_nonblank_pngs(tmp_path):
    mpimg = pytest.importorskip("matplotlib.image")
    path = _write(tmp_path / "run" / "metrics.jsonl", ROWS)
    written, skipped = plot_run(path, tmp_path / "out")
    slugs = ["reward", "passk", "val", "length", "entropy", "timing", "sync"]
    assert [p.name for p in written] == [f"{s}.png" for s in slugs] + ["overview.png"]
    assert skipped == ["KL", "clip fraction", "rollout vs trainer logprobs |old - rollout|", "idle seconds per role",
                       "policy lag of the trained samples", "reverse KL to the teacher (on-policy distillation)",
                       "multi-turn: assistant turns per trajectory", "multi-turn: solved after turn 1, failed, cut",
                       "tool calls per trajectory, malformed share", "tool call outcomes"]  # a single-turn run
    for p in written[:-1]:
        img = mpimg.imread(p)
        assert img.shape[:2] == (350, 600)  # 6 x 3.5 inches at 100 dpi
        assert len({tuple(px) for px in img.reshape(-1, img.shape[-1])[::7]}) > 10  # lines, text: not blank
    overview = mpimg.imread(written[-1])
    assert overview.shape[:2] == (350 * math.ceil(7 / 3), 600 * 3)
    assert overview[..., :3].std() > 0.05


# a tools run's rows (rlvr.runtime.rollout_stage.rollout_metrics, rlvr.envs.rollout.tool_metrics), as logged
TOOL_ROWS = [
    {"step": s, "reward/mean": 0.5, "rollout/turns_mean": 1.5 + s / 10, "rollout/solved_after_turn_1": 0.25,
     "rollout/env_failed_frac": 0.125, "rollout/excluded_frac": 0.125, "rollout/prefix_broken_frac": 0.0,
     "rollout/budget_end_frac": 0.0, "rollout/length_end_frac": 0.0625, "rollout/stop_id_end_frac": 0.0,
     "rollout/env_s": 2.0, "rollout/engine_idle_frac": 0.3, "rollout/obs_tokens_cut": 0.0, "tools/calls_per_traj": 0.9,
     "tools/malformed_frac": 0.1, "tools/time_frac": 0.2, "tools/calculator/ok": 7.0, "tools/calculator/error": 1.0,
     "tools/calculator/timeout": 0.0, "tools/calculator/crashed": 0.0, "tools/python_session/ok": 2.0,
     "tools/PythonSession/created": 2.0, "tools/PythonSession/closed": 2.0}
    for s in (1, 2)
]  # fmt: skip


def test_multi_turn_and_tool_panels_are_drawn_for_a_run_that_logs_them(tmp_path):
    """The four panels of a multi-turn / tools run, each with exactly its metrics (a stateful class's instance
    counts, the environment's seconds and the engines' idle share are not among them)."""
    series, _ = read_metrics(_write(tmp_path / "m.jsonl", TOOL_ROWS))
    by_slug = {p.slug: panel_metrics(p, series) for p in PANELS}
    assert by_slug["turns"] == ["rollout/turns_mean"]
    assert by_slug["trajectory_ends"] == [
        "rollout/budget_end_frac", "rollout/env_failed_frac", "rollout/length_end_frac",
        "rollout/prefix_broken_frac", "rollout/solved_after_turn_1", "rollout/stop_id_end_frac"]
    assert by_slug["tools"] == ["tools/calls_per_traj", "tools/malformed_frac"]
    assert by_slug["tool_outcomes"] == ["tools/calculator/crashed", "tools/calculator/error", "tools/calculator/ok",
                                        "tools/calculator/timeout", "tools/python_session/ok"]
    pytest.importorskip("matplotlib")
    written, skipped = plot_run(tmp_path / "m.jsonl", tmp_path / "out")
    assert [p.name for p in written] == ["reward.png", "turns.png", "trajectory_ends.png", "tools.png",
                                         "tool_outcomes.png", "overview.png"]
    assert "tool call outcomes" not in skipped


def test_cli_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    _write(run / "metrics.jsonl", [{"step": s, "reward/mean": s / 4, "sync/gbps": 1.0 + s / 8} for s in (1, 2)])
    assert main(["plot", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"wrote {run / 'plots' / 'overview.png'}" in out
    assert "skipped panel 'KL': none of its metrics are in metrics.jsonl" in out
    assert sorted(x.name for x in (run / "plots").iterdir()) == ["overview.png", "reward.png", "sync.png"]
    # a metrics file given directly, and --out
    assert main(["plot", str(run / "metrics.jsonl"), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "sync.png").is_file()


def test_cli_plot_errors(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    args = type("A", (), {"run_dir": str(tmp_path / "none"), "out": None})
    assert cmd_plot(args) == 2
    assert "no metrics file" in capsys.readouterr().err
    _write(tmp_path / "r" / "metrics.jsonl", [{"step": 1, "data/epoch": 0.0}])
    args.run_dir = str(tmp_path / "r")
    stream = io.StringIO()
    assert cmd_plot(args, stream) == 1
    assert "nothing to plot" in capsys.readouterr().err
    assert not (tmp_path / "r" / "plots").exists()


def test_plot_without_matplotlib(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    _write(tmp_path / "metrics.jsonl", ROWS)
    assert main(["plot", str(tmp_path)]) == 2
    assert "pip install matplotlib" in capsys.readouterr().err


def test_cli_plot_draws_the_role_timeline(tmp_path, capsys):
    """A run's timeline.jsonl (here: 2 steps, an engine generating beside the trainer's update) becomes
    timeline.png: one row per role, bars where it ran calls."""
    mpimg = pytest.importorskip("matplotlib.image")
    run = tmp_path / "run"
    _write(run / "metrics.jsonl", [{"step": s, "reward/mean": 0.5, "roles/engines_idle_s": 1.0} for s in (1, 2)])
    _write(run / "timeline.jsonl", [
        {"step": 1, "start": 0.0, "end": 2.0, "spans": [["engine0", "generate", 0.0, 1.5], ["reward", "score", 1.5, 1.6],
                                                       ["trainer0", "train_step", 0.1, 1.8], ["trainer0", "send_weights", 1.8, 2.0],
                                                       ["engine0", "receive_weights", 1.8, 2.0]]},
        {"step": 2, "start": 2.0, "end": 4.0, "spans": [["engine0", "generate", 2.0, 3.5], ["trainer0", "train_step", 2.1, 3.9]]},
    ])  # fmt: skip
    assert main(["plot", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"wrote {run / 'plots' / 'timeline.png'}" in out and f"wrote {run / 'plots' / 'idle.png'}" in out
    img = mpimg.imread(run / "plots" / "timeline.png")
    assert img.shape[1] == 1000 and img[..., :3].std() > 0.05
    (run / "timeline.jsonl").write_text("{not json\n")
    assert main(["plot", str(run)]) == 2  # a damaged timeline is an error, named
    assert "rlvr plot:" in capsys.readouterr().err
