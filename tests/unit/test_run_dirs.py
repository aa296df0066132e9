"""Run folders (issue 24): a failed run marks its folder FAILED (the error, the step reached, what next); the
next run of the same name reuses a folder whose run never completed a step instead of making ``name-2`` and
advising ``--resume`` of a run that never started; a folder that completed a step, or where a run is working,
is not reused. The loop on fake roles (tests/unit/loop_fakes.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from loop_fakes import FakeExecutor

from rlvr.recipe import load_recipe
from rlvr.runtime.controller import prepare_run_dir, train
from rlvr.runtime.rundir import FAILED, RUNNING, never_started, steps_done

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")


def _recipe(tmp_path, *overrides):
    return load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=local", "run.steps=1", "run.save_final=false",
                              "checkpoint.every_steps=0", *overrides])  # fmt: skip


def test_a_failed_start_is_marked_and_its_folder_reused(tmp_path, caplog):
    """Every prompt too long for data.max_prompt_tokens: the run fails at data load, before any step."""
    bad = _recipe(tmp_path, "data.max_prompt_tokens=2")
    run_dir = prepare_run_dir(bad)
    (run_dir / "dph_buffer.pt").write_text("an earlier start's buffer")  # what a later failure would leave
    with pytest.raises(ValueError, match="longer than data.max_prompt_tokens=2"):
        train(bad, run_dir, executor=FakeExecutor())
    mark = (run_dir / FAILED).read_text()
    assert mark.startswith("the run failed ") and " before step 1 (no step completed): ValueError: all 200 prompts" in mark
    assert f"no step completed: fix the cause and rerun; the run reuses {run_dir} (nothing there to --resume)" in mark
    assert not (run_dir / RUNNING).exists()
    with caplog.at_level("INFO"):
        again = prepare_run_dir(_recipe(tmp_path))
    assert again == run_dir == tmp_path / "tiny_test"  # not tiny_test-2
    assert "its earlier start never completed a step (the run failed " in caplog.text and "--resume" not in caplog.text
    assert sorted(p.name for p in again.iterdir()) == ["derived.json", "recipe.yaml", "train.log"]
    train(_recipe(tmp_path), again, executor=FakeExecutor())
    assert steps_done(again) == 1 and not (again / FAILED).exists() and not (again / RUNNING).exists()
    with caplog.at_level("WARNING"):
        third = prepare_run_dir(_recipe(tmp_path))  # it completed a step now: a new run goes beside it
    assert third == tmp_path / "tiny_test-2"
    assert f"{again} exists: this run writes {third}; its run completed 1 step(s) (to continue {again} instead, " \
           "add --resume auto)" in caplog.text


def test_a_folder_with_a_live_run_or_other_files_is_not_reused(tmp_path, caplog):
    base = tmp_path / "tiny_test"
    base.mkdir()
    (base / RUNNING).write_text(f"{os.getpid()} {socket.gethostname()} 2026-12-02T00:00:00\n")  # this process: alive
    with caplog.at_level("WARNING"):
        assert prepare_run_dir(_recipe(tmp_path)) == tmp_path / "tiny_test-2"
    assert f"a run is working in it (pid {os.getpid()} on {socket.gethostname()}; wait for it, or stop it)" in caplog.text
    (base / RUNNING).write_text(f"{2**22 + 12345} {socket.gethostname()} 2026-12-02T00:00:00\n")  # a dead process
    assert never_started(base)
    (base / "notes.txt").write_text("the user's own")
    assert not never_started(base)  # a file no start writes: left alone


def test_a_failure_after_a_step_says_what_to_resume(tmp_path, monkeypatch):
    import loop_fakes

    calls = []

    def fail_second(self, batch, dph=None):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the second update fails")
        return real(self, batch, dph)

    real = loop_fakes.FakeTrainer.train_step
    monkeypatch.setattr(loop_fakes.FakeTrainer, "train_step", fail_second)
    r = _recipe(tmp_path, "run.steps=3", "checkpoint.every_steps=1")
    with pytest.raises(Exception, match="the second update fails"):
        train(r, executor=FakeExecutor())
    mark = (tmp_path / "tiny_test" / FAILED).read_text()
    assert " after step 1: RoleError: step 2: policy update: trainer0.train_step failed: RuntimeError: the second " \
           "update fails" in mark
    assert "its last complete checkpoint is " in mark and "step_000001: continue from it with --resume auto" in mark
    assert not never_started(tmp_path / "tiny_test")


def test_rlvr_train_retries_a_failed_start_in_the_same_folder(tmp_path, capsys):
    """Before issue 24 the second attempt went to tiny_test-2, with advice to --resume a run that never started."""
    from rlvr.cli import main

    argv = ["train", TINY, f"run.output_dir={tmp_path}", "run.executor=local", "data.max_prompt_tokens=2"]
    for _ in range(2):
        assert main(argv) == 1
        out, err = capsys.readouterr()
        assert f"run folder: {tmp_path / 'tiny_test'} (" in out
        assert f"{tmp_path / 'tiny_test' / FAILED} marks the folder)\nno step completed: fix the cause and rerun; the " \
               f"run reuses {tmp_path / 'tiny_test'} (nothing there to --resume)" in err
        assert "--resume auto" not in out + err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_test"]


def test_a_start_up_failure_writes_no_colour_codes(tmp_path, capsys, monkeypatch):
    """A role that fails at start with Ray's coloured error text: before issue 24 the raw ANSI codes went into
    train.log and onto a console that is not a terminal (here pytest's captured stderr)."""
    import loop_fakes

    from rlvr.cli import main
    from rlvr.runtime import roles

    def setup(self, master_addr, master_port):
        raise RuntimeError("\x1b[36mray::PolicyWorker.setup()\x1b[39m (pid=7) \x1b[1;31mOSError\x1b[0m: no such device")

    monkeypatch.setattr(loop_fakes.FakeTrainer, "setup", setup)
    monkeypatch.setattr(roles, "LocalExecutor", FakeExecutor)
    assert main(["train", TINY, f"run.output_dir={tmp_path}", "run.executor=local"]) == 1
    run = tmp_path / "tiny_test"
    for where, text in (("console", capsys.readouterr().err), ("train.log", (run / "train.log").read_text()),
                        (FAILED, (run / FAILED).read_text())):  # fmt: skip
        assert "trainer0.setup failed: RuntimeError: ray::PolicyWorker.setup() (pid=7) OSError: no such device" in text
        assert "\x1b" not in text, where
