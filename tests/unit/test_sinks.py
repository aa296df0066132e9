"""JsonlSink output format and the Progress display's plain (non-TTY) mode."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch

from rlvr.metrics.progress import Progress, headline
from rlvr.metrics.sinks import JsonlSink


def test_jsonl_lines_types_and_null(tmp_path):
    path = tmp_path / "sub" / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.log(1, {"reward/mean": torch.tensor(0.5), "passk/8": np.float32(0.75), "timing/rollout_s": 3})
    # flushed before close: readable now
    assert json.loads(path.read_text().splitlines()[0]) == {
        "step": 1, "reward/mean": 0.5, "passk/8": 0.75, "timing/rollout_s": 3.0
    }
    sink.log(2, {"sync/gbps": float("nan"), "loss/kl": math.inf, "flag": True})
    sink.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    assert "NaN" not in lines[1] and "Infinity" not in lines[1]
    row = json.loads(lines[1])
    assert row == {"step": 2, "sync/gbps": None, "loss/kl": None, "flag": 1.0}
    assert isinstance(json.loads(lines[0])["timing/rollout_s"], float)


def test_jsonl_appends_on_resume_and_errors(tmp_path):
    path = tmp_path / "m.jsonl"
    with JsonlSink(path) as s:
        s.log(1, {"a": 1.0})
    with JsonlSink(path) as s:
        s.log(2, {"a": 2.0})
        with pytest.raises(ValueError):
            s.log(3, {"step": 1.0})
        with pytest.raises(TypeError):
            s.log(3, {"a": "text"})
        with pytest.raises(TypeError):
            s.log(3, {"a": torch.ones(2)})
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]
    with pytest.raises(ValueError):
        s.log(4, {"a": 1.0})


def test_headline_picks_largest_passk():
    text = headline({"reward/mean": 0.45, "passk/1": 0.3, "passk/16": 0.9, "passk/8": 0.8, "timing/step_s": 12.34})
    assert text == "reward/mean=0.4500 passk/16=0.9000 step_s=12.3"
    assert headline({"loss/policy": 1.0}) == ""
    # idle shares: 6.2 of 10 s for the engines, 0.4 for the trainer
    idle = headline({"timing/step_s": 10.0, "roles/engines_idle_s": 6.2, "roles/trainer_idle_s": 0.4})
    assert idle == "step_s=10.0 idle engines=62% trainer=4%"
    # multi-turn with tools: turns per trajectory, tool calls and the malformed share (a new user had to open
    # metrics.jsonl to follow tool use)
    tools = headline({"reward/mean": 0.5, "rollout/turns_mean": 1.97, "tools/calls_per_traj": 0.969,
                      "tools/malformed_frac": 0.0645, "timing/step_s": 98.0})
    assert tools == "reward/mean=0.5000 turns=1.97 tool_calls=0.97 malformed=0.06 step_s=98.0"


def test_progress_plain_lines_with_eta():
    out = io.StringIO()  # not a TTY
    now = [100.0]
    prog = Progress(10, True, start_step=4, stream=out, clock=lambda: now[0])
    now[0] = 130.0  # 2 steps in 30 s -> 15 s per step, 4 steps left -> 60 s
    prog.update(6, {"reward/mean": 0.5, "passk/4": 0.25, "timing/step_s": 15.0})
    prog.close()
    assert out.getvalue() == "step 6/10 | reward/mean=0.5000 passk/4=0.2500 step_s=15.0 | eta 0:01:00\n"


def test_progress_disabled_prints_nothing():
    out = io.StringIO()
    prog = Progress(3, False, stream=out)
    prog.update(1, {"reward/mean": 1.0})
    prog.close()
    assert out.getvalue() == ""
