"""The console progress of a run on a non-terminal console (issue 24): the ETA counts the steps only, not the
start-up; a long step prints a heartbeat line saying what it waits on. A fake clock for the arithmetic, and the
real loop on fake roles (tests/unit/loop_fakes.py) for the wiring."""

from __future__ import annotations

import functools
import io
import re
from pathlib import Path

import loop_fakes
from loop_fakes import FakeExecutor

import rlvr.runtime.controller as controller
from rlvr.metrics.progress import Progress
from rlvr.recipe import load_recipe
from rlvr.runtime.waits import Waits

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")


def _recipe(tmp_path, *overrides):
    return load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=local", "run.steps=3", "run.save_final=false",
                              "checkpoint.every_steps=0", "metrics.progress=true", *overrides])  # fmt: skip


def test_the_eta_counts_from_the_first_step_not_from_the_start_up():
    now, out = [0.0], io.StringIO()
    prog = Progress(10, True, stream=out, clock=lambda: now[0], heartbeat_s=0)
    now[0] = 600.0  # ten minutes of start-up (model load, engines, the weight-sync group)
    prog.start_clock()
    now[0] = 605.0  # a 5 s step
    prog.update(1, {})
    assert out.getvalue() == "step 1/10 | eta 0:00:45\n"  # 9 steps x 5 s, not 9 x 605 s


def test_the_loop_starts_the_eta_clock_once_the_roles_are_up(tmp_path, monkeypatch):
    """The roles take 600 (fake) seconds to come up and each update 5: step 1 of 3 says 0:00:10 left (it said
    0:20:10 when the clock started with the Progress, before the roles)."""
    now, out = [0.0], io.StringIO()
    monkeypatch.setattr(controller, "Progress", functools.partial(Progress, stream=out, clock=lambda: now[0], heartbeat_s=0))

    class SlowStart(controller.Roles):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            now[0] += 600.0

    real_step = loop_fakes.FakeTrainer.train_step

    def step_5s(self, batch, dph=None):
        now[0] += 5.0
        return real_step(self, batch, dph)

    monkeypatch.setattr(controller, "Roles", SlowStart)
    monkeypatch.setattr(loop_fakes.FakeTrainer, "train_step", step_5s)
    controller.train(_recipe(tmp_path), executor=FakeExecutor())
    etas = re.findall(r"^step (\d)/3 .*\| eta (\S+)$", out.getvalue(), re.M)
    assert etas == [("1", "0:00:10"), ("2", "0:00:05"), ("3", "0:00:00")]


def test_a_heartbeat_says_what_the_step_waits_on_every_interval():
    now, out = [0.0], io.StringIO()
    clock = lambda: now[0]  # noqa: E731
    waits = Waits(clock)
    prog = Progress(10, True, stream=out, clock=clock, heartbeat_s=60)
    prog.watch(waits)
    prog.close()  # the thread stops; beat() is driven by hand below
    now[0] = 59.0
    assert prog.beat() is None  # less than a minute since the roles came up
    now[0] = 60.0
    assert prog.beat() == ("before step 1/10: 0:01:00 since the roles came up | not waiting on a role (the "
                           "controller's own work: advantages, metrics, checkpoint)")
    prog.start_clock()  # at 60 s
    now[0] = 70.0
    with waits.waiting("step 1: policy update", ["trainer0", "trainer1", "trainer0"]):
        now[0] = 119.0
        assert prog.beat() is None  # 59 s since the last line
        now[0] = 120.0
        assert prog.beat() == "step 1/10 running 0:01:00 | waiting 0:00:50 on policy update (trainer0, trainer1)"
        now[0] = 179.0
        assert prog.beat() is None
        now[0] = 180.0
        assert prog.beat() == "step 1/10 running 0:02:00 | waiting 0:01:50 on policy update (trainer0, trainer1)"
        prog.update(1, {})  # a step line resets the interval
    with waits.waiting("step 2: rollout", ["engine0"]):
        with waits.waiting("step 2: rollout", ["engine0"]):  # nested (as_completed's own get): the outer one counts
            now[0] = 239.0
            assert prog.beat() is None
            now[0] = 240.0
            assert prog.beat() == "step 2/10 running 0:01:00 | waiting 0:01:00 on rollout (engine0)"
    assert out.getvalue().count("\n") == 5


def test_a_long_update_prints_heartbeats_from_the_real_loop(tmp_path, monkeypatch):
    """Fake roles, real threads: each update takes 0.6 s and the heartbeat interval is 0.2 s."""
    out = io.StringIO()
    monkeypatch.setattr(controller, "Progress", functools.partial(Progress, stream=out, heartbeat_s=0.2))
    controller.train(_recipe(tmp_path, "run.steps=1"), executor=FakeExecutor(train_s=0.6))
    lines = out.getvalue().splitlines()
    beats = [x for x in lines if "on policy update (trainer0)" in x]
    assert beats and all(re.fullmatch(r"step 1/1 running 0:00:0\d \| waiting 0:00:0\d on policy update \(trainer0\)", x)
                         for x in beats), lines  # fmt: skip
    assert lines[-1].startswith("step 1/1 | ")


def test_no_heartbeat_when_disabled_or_every_step_is_quick():
    out = io.StringIO()
    prog = Progress(3, False, stream=out, heartbeat_s=0.01)
    prog.watch(Waits())
    assert prog._beater is None
    prog.close()
    assert out.getvalue() == ""
