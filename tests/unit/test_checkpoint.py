"""Checkpoint mechanics: atomic commit, crash leftovers, pruning with a best, resume checks, RNG and sampler state."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from rlvr.config import RecipeError
from rlvr.recipe import load_recipe
from rlvr.data import PromptSampler
from rlvr.runtime import checkpoint as ck
from rlvr.seeding import rng_state, set_rng_state
from rlvr.types import Prompt

PROMPTS = [{"text": f"What is {i} plus 1?", "gold": str(i + 1)} for i in range(12)]


def _recipe(*overrides: str):
    return load_recipe(None, ["run.steps=6", *overrides])


def _write(run_dir: Path, step: int, metrics: dict | None = None, recipe=None, prompts=PROMPTS) -> Path:
    """A whole checkpoint as the controller would write it, with a stand-in trainer part."""
    tmp = ck.begin(run_dir, step)
    (tmp / "trainer").mkdir()
    (tmp / "trainer" / "weights.bin").write_bytes(bytes([step % 256]) * 64)
    ck.save_controller(
        tmp,
        step=step,
        policy_version=step,
        sampler_state={"epoch": 0, "offset": step % 12, "seed": 0},
        recipe=recipe or _recipe(),
        data_fp=ck.data_fingerprint(prompts),
        metrics=metrics,
    )
    return ck.commit(tmp)


def _names(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def test_commit_renames_and_marks_complete(tmp_path):
    tmp = ck.begin(tmp_path, 10)
    assert tmp.parent == tmp_path / "checkpoints" and tmp.name.startswith("step_000010.tmp-")
    assert ck.latest_complete(tmp_path) is None  # a write in progress is not a checkpoint
    final = _write(tmp_path, 10)
    ck.abandon(tmp)
    assert final == tmp_path / "checkpoints" / "step_000010"
    assert (final / "COMPLETE").is_file() and ck.is_complete(final)
    assert json.loads((final / "COMPLETE").read_text())["step"] == 10
    assert (final / "trainer" / "weights.bin").read_bytes() == bytes([10]) * 64
    assert _names(tmp_path) == ["step_000010"]
    assert ck.latest_complete(tmp_path) == final and ck.checkpoint_step(final) == 10


def test_commit_refuses_a_checkpoint_missing_a_part(tmp_path):
    tmp = ck.begin(tmp_path, 5)
    (tmp / "trainer").mkdir()
    with pytest.raises(ValueError, match=r"lacks \['controller.json', 'recipe.yaml', 'fingerprint.json'\]"):
        ck.commit(tmp)
    assert tmp.is_dir() and not (tmp / "COMPLETE").exists()
    assert ck.latest_complete(tmp_path) is None
    ck.abandon(tmp)
    assert not tmp.exists()


def test_commit_replaces_an_existing_step(tmp_path):
    _write(tmp_path, 10, metrics={"m": 1.0})
    second = _write(tmp_path, 10, metrics={"m": 2.0})
    assert _names(tmp_path) == ["step_000010"]  # no .old-* or .tmp-* left behind
    assert ck.load_controller(second).metrics == {"m": 2.0}


def test_crash_leftovers_are_ignored_and_pruned(tmp_path):
    _write(tmp_path, 10)
    _write(tmp_path, 20)
    root = tmp_path / "checkpoints"
    crashed = root / "step_000030.tmp-99999-deadbeef"  # another process died while writing step 30
    (crashed / "trainer").mkdir(parents=True)
    (crashed / "controller.json").write_text('{"step": 30}')
    no_marker = root / "step_000040"  # a final-looking name without COMPLETE
    (no_marker / "trainer").mkdir(parents=True)
    (no_marker / "controller.json").write_text('{"step": 40}')
    mine = ck.begin(tmp_path, 50)  # this process is writing step 50 right now
    assert ck.latest_complete(tmp_path) == root / "step_000020"
    deleted = ck.prune(tmp_path, keep_last=5)
    assert sorted(p.name for p in deleted) == ["step_000030.tmp-99999-deadbeef", "step_000040"]
    assert _names(tmp_path) == ["step_000010", "step_000020", mine.name]
    ck.abandon(mine)
    assert _names(tmp_path) == ["step_000010", "step_000020"]


# steps 10..50 with val/acc 0.2, 0.7, NaN (not measured), 0.7, 0.4; keep_last=2 keeps 40 and 50.
# max: best 0.7 at 20 and 40, the earliest (20) wins -> {20, 40, 50}; min: best 0.2 at 10 -> {10, 40, 50};
# no metric -> {40, 50}; keep_last=1 keeps the newest (50) and the best (20); keep_last=0 keeps all five.
@pytest.mark.parametrize(
    "keep_last, metric, mode, remaining",
    [
        (2, "val/acc", "max", [20, 40, 50]),
        (2, "val/acc", "min", [10, 40, 50]),
        (2, None, "max", [40, 50]),
        (1, "val/acc", "max", [20, 50]),
        (0, "val/acc", "max", [10, 20, 30, 40, 50]),
        (0, None, "max", [10, 20, 30, 40, 50]),
        (2, "val/unlogged", "max", [40, 50]),
    ],
)
def test_prune_keeps_last_and_best(tmp_path, keep_last, metric, mode, remaining):
    for step, value in zip((10, 20, 30, 40, 50), (0.2, 0.7, float("nan"), 0.7, 0.4)):
        _write(tmp_path, step, metrics={"val/acc": value, "reward/mean": 0.1})
    ck.prune(tmp_path, keep_last=keep_last, best_metric=metric, best_mode=mode)
    assert _names(tmp_path) == [f"step_{s:06d}" for s in remaining]


def test_keep_all_still_deletes_crash_leftovers_and_negative_is_refused(tmp_path):
    for step in (10, 20, 30):
        _write(tmp_path, step)
    crashed = tmp_path / "checkpoints" / "step_000040.tmp-99999-deadbeef"
    crashed.mkdir()
    assert ck.prune(tmp_path, keep_last=0) == [crashed]  # 0 keeps every whole checkpoint, not a broken write
    assert _names(tmp_path) == ["step_000010", "step_000020", "step_000030"]
    with pytest.raises(ValueError, match="keep_last=-1: keep the newest K >= 1 checkpoints, or 0 to keep every one"):
        ck.prune(tmp_path, keep_last=-1)
    assert _names(tmp_path) == ["step_000010", "step_000020", "step_000030"]


def test_best_checkpoint_and_bad_mode(tmp_path):
    for step, value in ((10, 0.5), (20, 0.25), (30, 0.75)):
        _write(tmp_path, step, metrics={"val/acc": value})
    assert ck.best_checkpoint(tmp_path, "val/acc", "max").name == "step_000030"
    assert ck.best_checkpoint(tmp_path, "val/acc", "min").name == "step_000020"
    assert ck.best_checkpoint(tmp_path, "nope") is None
    with pytest.raises(ValueError, match="best_mode must be 'max' or 'min'"):
        ck.prune(tmp_path, 2, "val/acc", "largest")


def test_resolve_resume_auto(tmp_path):
    run = tmp_path / "runs" / "demo"
    assert ck.resolve_resume("auto", run) is None  # no run folder yet: a fresh start
    assert ck.resolve_resume(None, run) is None
    (run / "checkpoints" / "step_000010.tmp-1-ab").mkdir(parents=True)
    assert ck.resolve_resume("auto", run) is None  # only an interrupted write
    _write(run, 10)
    _write(run, 20)
    assert ck.resolve_resume("auto", run) == run / "checkpoints" / "step_000020"
    assert ck.resolve_resume(str(run / "checkpoints" / "step_000010"), run) == run / "checkpoints" / "step_000010"


def test_resolve_resume_bad_paths(tmp_path):
    run = tmp_path / "demo"
    missing = tmp_path / "nowhere" / "step_000010"
    with pytest.raises(FileNotFoundError) as e:
        ck.resolve_resume(str(missing), run)
    assert str(missing) in str(e.value) and "--resume auto" in str(e.value)
    good = _write(run, 10)
    crashed = run / "checkpoints" / "step_000020.tmp-4242-00ff"
    crashed.mkdir()
    with pytest.raises(ValueError) as e:
        ck.resolve_resume(str(crashed), run)
    assert str(crashed) in str(e.value) and "not a complete checkpoint" in str(e.value)
    assert f"resume from {good} instead" in str(e.value)
    with pytest.raises(ValueError, match=f"is a run's folder.*e.g. --resume {good}"):
        ck.resolve_resume(str(run), run)
    with pytest.raises(ValueError, match="is a file"):
        ck.resolve_resume(str(good / "controller.json"), run)
    with pytest.raises(ValueError, match="not a checkpoint folder"):
        ck.resolve_resume(str(good / "trainer"), run)


def test_check_compatible(tmp_path):
    ckpt = _write(tmp_path, 3, recipe=_recipe())
    data = ck.data_fingerprint(PROMPTS)
    # may change: more steps, where the run lives, logging, checkpointing, threads, micro-batch size
    ck.check_compatible(
        ckpt,
        _recipe("run.steps=20", "run.name=other", "run.resume=auto", "metrics.progress=false", "checkpoint.keep_last=5",
                "validation.every_steps=0", "trainer.threads=2", "trainer.micro_batch_size=4"),
        data,
    )  # fmt: skip
    ck.check_compatible(ckpt, _recipe("trainer.lr=2e-5"), data)  # optimizer settings may change (OPTIMIZER_KEYS)
    with pytest.raises(RecipeError) as e:
        ck.check_compatible(ckpt, _recipe("algorithm.kl_coef=0.1"), data)
    msg = str(e.value)
    assert "algorithm.kl_coef: 0.0 -> 0.1" in msg and "revert" in msg and "start a new run" in msg
    assert "training data" not in msg
    with pytest.raises(RecipeError) as e:
        ck.check_compatible(ckpt, _recipe("rollout.temperature=0.7"), ck.data_fingerprint(PROMPTS[:11]))
    msg = str(e.value)
    assert "rollout.temperature: 1.0 -> 0.7" in msg
    assert "training data changed: 12 prompts -> 11 prompts" in msg
    with pytest.raises(RecipeError, match="same count, different content or order"):
        ck.check_compatible(ckpt, _recipe(), ck.data_fingerprint(PROMPTS[::-1]))
    # another model: the same rows tokenise otherwise; the message says why rather than "different content"
    with pytest.raises(RecipeError) as e:
        ck.check_compatible(ckpt, _recipe("model.path=tiny-random"), ck.data_fingerprint(PROMPTS[::-1]))
    assert "model.path changed the tokenizer" in str(e.value) and "different content" not in str(e.value)
    # case C1: a resume with nothing left to run is refused, not a silent success
    with pytest.raises(RecipeError, match=r"(?s)run.steps=3 but the checkpoint is at step 3.*raise run.steps above 3"):
        ck.check_compatible(ckpt, _recipe("run.steps=3"), data)


def test_recipe_diff_lists_absent_keys_and_whole_lists():
    old = {"trainer": {"lr": 1e-5, "betas": [0.9, 0.999]}, "run": {"steps": 3},
           "reward": {"verifiers": [{"name": "math"}]}, "data": {"generated": {"ops": ["plus"]}}}
    new = {"trainer": {"lr": 2e-5, "betas": [0.9, 0.99], "extra": 1}, "run": {"steps": 9},
           "reward": {"verifiers": [{"name": "numeric"}]}, "data": {"generated": {"ops": ["plus", "minus"]}}}
    diff = {k: (repr(a), repr(b)) for k, a, b in ck.recipe_diff(old, new)}
    assert diff == {  # run.steps, trainer.lr and trainer.betas may change on resume: left out
        "data.generated.ops": ("['plus']", "['plus', 'minus']"),
        "reward.verifiers": ("[{'name': 'math'}]", "[{'name': 'numeric'}]"),
        "trainer.extra": ("<absent>", "1"),
    }
    # a setting newer than the checkpoint (absent there) is no change while it has its default value
    defaults = {"trainer": {"extra": 1}, "judge": {"model": None}}
    newer = {**new, "judge": {"model": None}}
    assert "trainer.extra" not in {k for k, _, _ in ck.recipe_diff(old, newer, defaults)}
    assert "judge.model" not in {k for k, _, _ in ck.recipe_diff(old, newer, defaults)}
    judged = {**new, "judge": {"model": "smollm2-135m-instruct"}}
    assert ("judge.model", "<absent>", "'smollm2-135m-instruct'") in {
        (k, repr(a), repr(b)) for k, a, b in ck.recipe_diff(old, judged, defaults)}


def test_fingerprints():
    objs = [Prompt(index=i, text=p["text"], prompt_ids=[1, 2], gold=p["gold"]) for i, p in enumerate(PROMPTS)]
    fp = ck.data_fingerprint(PROMPTS)
    assert fp == ck.data_fingerprint(objs) and fp["count"] == 12 and len(fp["sha256"]) == 64
    changed_gold = [dict(p) for p in PROMPTS]
    changed_gold[5]["gold"] = "7"
    assert ck.data_fingerprint(changed_gold)["sha256"] != fp["sha256"]
    with_row = [dict(p, row={"tests": np.array([1, 2])}) for p in PROMPTS]
    assert ck.data_fingerprint(with_row)["sha256"] != fp["sha256"]
    base = ck.recipe_fingerprint(_recipe())
    assert base == ck.recipe_fingerprint(_recipe("run.steps=50", "checkpoint.every_steps=5"))
    assert base == ck.recipe_fingerprint(_recipe("trainer.lr=2e-5"))  # an optimizer setting may change on resume
    assert base != ck.recipe_fingerprint(_recipe("algorithm.kl_coef=0.1"))


def test_controller_state_round_trip(tmp_path):
    ckpt = _write(tmp_path, 7, metrics={"reward/mean": 0.25, "train/kl": float("inf")})
    state = ck.load_controller(ckpt)
    assert (state.step, state.policy_version) == (7, 7)
    assert state.sampler == {"epoch": 0, "offset": 7, "seed": 0}
    assert state.metrics == {"reward/mean": 0.25, "train/kl": None}
    fp = json.loads((ckpt / "fingerprint.json").read_text())
    assert fp["data"] == ck.data_fingerprint(PROMPTS) and fp["recipe_sha256"] == ck.recipe_fingerprint(_recipe())
    assert "run:" in (ckpt / "recipe.yaml").read_text()


def _draw() -> list[float]:
    return [random.random(), random.gauss(0, 1), *np.random.rand(3).tolist(), *torch.rand(3).tolist(),
            float(torch.randn(1))]  # fmt: skip


def test_rng_round_trip():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    _draw()
    saved = json.loads(json.dumps(rng_state()))  # through JSON, as controller.json stores it
    expected = _draw()
    _draw()
    set_rng_state(saved)
    assert _draw() == expected


def test_sampler_resume_at_epoch_boundary_c1(tmp_path):
    # C1 in small: 12 prompts, 4 a batch -> 3 batches an epoch; 2 epochs = 6 steps; stop after step 3
    n, p, seed, steps = 12, 4, 5, 6
    uninterrupted = PromptSampler(n, p, seed)
    full = [uninterrupted.next_batch() for _ in range(steps)]
    first = PromptSampler(n, p, seed)
    for _ in range(3):
        first.next_batch()
    tmp = ck.begin(tmp_path, 3)
    (tmp / "trainer").mkdir()
    ck.save_controller(tmp, step=3, policy_version=3, sampler_state=first.state_dict(),
                       recipe=_recipe(f"run.steps={steps}"), data_fp=ck.data_fingerprint(PROMPTS))  # fmt: skip
    ckpt = ck.commit(tmp)

    state = ck.load_controller(ckpt)
    assert state.sampler == {"epoch": 1, "offset": 0, "seed": seed}
    recipe = _recipe(f"run.steps={steps}")
    ck.check_compatible(ckpt, recipe, ck.data_fingerprint(PROMPTS))
    remaining = range(state.step + 1, recipe.run.steps + 1)
    assert len(remaining) == 3
    resumed = PromptSampler(n, p, seed=999)
    resumed.load_state_dict(state.sampler)
    rest = [resumed.next_batch() for _ in remaining]
    assert rest == full[3:]
    epoch1 = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1)).tolist()
    assert rest == [epoch1[0:4], epoch1[4:8], epoch1[8:12]]


def test_prepare_run_dir_resume_paths(tmp_path, caplog):
    """A resume path that is not a checkpoint creates nothing; an existing run folder with --resume auto keeps its
    recipe.yaml until train() finds the checkpoint compatible; a name whose run completed a step warns that the
    run goes to name-2 (tests/unit/test_run_dirs.py: a folder whose run never completed one is reused)."""
    from rlvr.recipe import load_recipe
    from rlvr.runtime.controller import prepare_run_dir

    bad = tmp_path / "nope" / "checkpoints" / "step_000003"
    with pytest.raises(FileNotFoundError):
        prepare_run_dir(load_recipe(None, [f"run.output_dir={tmp_path}", f"run.resume={bad}"]))
    assert not (tmp_path / "nope").exists()
    first = prepare_run_dir(load_recipe(None, [f"run.output_dir={tmp_path}", "run.name=r"]))
    assert first == tmp_path / "r"
    again = prepare_run_dir(load_recipe(None, [f"run.output_dir={tmp_path}", "run.name=r", "run.resume=auto", "trainer.lr=0.5"]))
    assert again == first and "lr: 1.0e-05" in (first / "recipe.yaml").read_text()  # not rewritten yet
    (first / "metrics.jsonl").write_text('{"step": 1}\n')  # its run completed a step: not reused
    with caplog.at_level("WARNING"):
        second = prepare_run_dir(load_recipe(None, [f"run.output_dir={tmp_path}", "run.name=r"]))
    assert second == tmp_path / "r-2"
    assert "add --resume auto" in caplog.text
