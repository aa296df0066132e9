"""Optimizer settings changed on resume (``rlvr train R.yaml --resume auto trainer.lr=2e-5``), as in verl and
OpenRLHF: the checkpoint's optimizer state (Adam's moments, step count) is loaded, then the new recipe's lr, betas
and weight decay replace the ones that state held; the resume check lets them through and lists them old -> new."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr.recipe import load_recipe
from rlvr.runtime import checkpoint as ck
from rlvr.train.policy import apply_optimizer_settings

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")
SMALL = ["run.executor=local", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2", "trainer.micro_batch_size=2"]


def test_new_lr_applies_after_loading_by_hand():
    """One weight, AdamW without decay. Step 1, gradient 1 at lr 0.1: m1 = 0.1, v1 = 0.001, bias-corrected
    m^ = 0.1 / (1 - 0.9) = 1, v^ = 0.001 / (1 - 0.999) = 1: the weight moves by lr = 0.1, 1.0 -> 0.9.

    Resumed with lr 0.01: the optimizer is built at 0.01, ``load_state_dict`` brings back 0.1 (the saved param
    group), :func:`apply_optimizer_settings` sets 0.01 again. Step 2, gradient 3, on the loaded moments:
    m2 = 0.9 * 0.1 + 0.1 * 3 = 0.39, m^ = 0.39 / (1 - 0.81) = 39/19; v2 = 0.999 * 0.001 + 0.001 * 9 = 0.009999,
    v^ = 0.009999 / (1 - 0.998001) = 9999/1999; step = 0.01 * (39/19) / sqrt(9999/1999) = 0.01 * 0.917781:
    0.9 -> 0.890822. (At the checkpoint's lr 0.1 it would be 0.808222; from fresh moments, 0.9 - 0.01 = 0.89.)"""
    p = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = torch.optim.AdamW([p], lr=0.1, weight_decay=0.0)
    p.grad = torch.tensor([1.0], dtype=torch.float64)
    opt.step()
    assert float(p.detach()) == pytest.approx(0.9, abs=1e-8)  # eps 1e-8 in the denominators: ~1e-9 off
    saved = opt.state_dict()

    resumed = torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.999), weight_decay=0.0)
    resumed.load_state_dict(saved)
    assert resumed.param_groups[0]["lr"] == 0.1  # what load_state_dict alone leaves: the checkpoint's
    changes = apply_optimizer_settings(resumed, lr=0.01, betas=(0.9, 0.999), weight_decay=0.0)
    assert changes == [("lr", 0.1, 0.01)]  # betas and weight decay unchanged: not listed
    p.grad = torch.tensor([3.0], dtype=torch.float64)
    resumed.step()
    assert float(p.detach()) == pytest.approx(0.9 - 0.01 * (39 / 19) / (9999 / 1999) ** 0.5, abs=1e-8)
    assert float(p.detach()) == pytest.approx(0.890822, abs=1e-6)


def _batch():
    from rlvr.train.batch import pack
    from rlvr.types import Completion

    comps = [Completion(prompt_index=i // 2, sample_index=i % 2, prompt_ids=[1, 4, 41, 5], token_ids=[6, 7, 2],
                        logprobs=[-1.0, -2.0, -0.5], text="x", finish_reason="stop", policy_version=0)
             for i in range(4)]  # fmt: skip
    return pack(comps, torch.tensor([1.0, -1.0, 0.5, -0.5]), 0, 8)


def test_policy_worker_load_state_takes_the_new_recipes_optimizer_settings(tmp_path):
    """The torch backend on the tiny model: one update at tiny_test.yaml's lr 1e-3, betas (0.9, 0.999), weight
    decay 0, saved; a worker of the resumed recipe (lr 2e-5, betas (0.8, 0.99), weight decay 0.1) loads it: its
    param groups hold the new values and its Adam state is the saved one (step 1, the same first moments)."""
    from rlvr.models import resolve_model
    from rlvr.train.policy import PolicyWorker

    model_dir = resolve_model("tiny-random")
    first = PolicyWorker(load_recipe(TINY, SMALL), model_dir, 0, 1, "127.0.0.1", 0)
    first.train_step(_batch())
    first.save_state(str(tmp_path / "trainer"))
    new = ["trainer.lr=2e-5", "trainer.betas=[0.8, 0.99]", "trainer.weight_decay=0.1"]
    resumed = PolicyWorker(load_recipe(TINY, [*SMALL, *new]), model_dir, 0, 1, "127.0.0.1", 0)
    assert resumed.load_state(str(tmp_path / "trainer")) == 1
    groups = resumed.optimizer.param_groups
    assert {(g["lr"], tuple(g["betas"]), g["weight_decay"]) for g in groups} == {(2e-5, (0.8, 0.99), 0.1)}
    saved, loaded = first.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert set(loaded) == set(saved) and all(float(loaded[i]["step"]) == 1.0 for i in loaded)
    assert all(torch.equal(loaded[i]["exp_avg"], saved[i]["exp_avg"]) for i in saved)


def test_critic_load_state_takes_the_new_lr_and_betas(tmp_path):
    from rlvr.models import resolve_model
    from rlvr.train.critic import CriticWorker

    model_dir = resolve_model("tiny-random")
    first = CriticWorker(load_recipe(TINY, SMALL), model_dir)
    first.save_state(str(tmp_path / "critic"))
    resumed = CriticWorker(load_recipe(TINY, [*SMALL, "critic.lr=3e-6", "trainer.betas=[0.8, 0.99]"]), model_dir)
    resumed.load_state(str(tmp_path / "critic"))
    g = resumed.optimizer.param_groups[0]
    # the weight decay stays torch AdamW's default 0.01, as the critic's optimizer is built
    assert (g["lr"], tuple(g["betas"]), g["weight_decay"]) == (3e-6, (0.8, 0.99), 0.01)


def _checkpoint(run_dir: Path, recipe) -> Path:
    tmp = ck.begin(run_dir, 3)
    (tmp / "trainer").mkdir()
    ck.save_controller(tmp, step=3, policy_version=3, sampler_state={"epoch": 0, "offset": 0, "seed": 0},
                       recipe=recipe, data_fp=ck.data_fingerprint([]))  # fmt: skip
    return ck.commit(tmp)


def test_resume_check_lets_optimizer_settings_change_and_lists_them(tmp_path):
    ckpt = _checkpoint(tmp_path, load_recipe(None, ["run.steps=6"]))
    changed = load_recipe(None, ["run.steps=6", "trainer.lr=2e-5", "trainer.betas=[0.9, 0.95]",
                                 "trainer.grad_clip=0.5", "critic.lr=1e-6"])  # fmt: skip
    ck.check_compatible(ckpt, changed, ck.data_fingerprint([]))  # no RecipeError
    # defaults: lr 1e-5, betas (0.9, 0.999), grad_clip 1.0, critic.lr 1e-5; weight decay and critic clip unchanged
    assert ck.optimizer_changes(ckpt, changed) == [("trainer.lr", 1e-5, 2e-5), ("trainer.betas", [0.9, 0.999], [0.9, 0.95]),
                                                   ("trainer.grad_clip", 1.0, 0.5), ("critic.lr", 1e-5, 1e-6)]  # fmt: skip
    assert ck.optimizer_changes(ckpt, load_recipe(None, ["run.steps=6"])) == []
    assert ck.recipe_fingerprint(changed) == ck.recipe_fingerprint(load_recipe(None, ["run.steps=6"]))


def test_the_controller_logs_each_change_old_to_new(tmp_path, caplog):
    import types

    from rlvr.runtime.rundir import resume_point as _resume_point

    run = tmp_path / "run"
    _checkpoint(run, load_recipe(None, ["run.steps=6"]))  # step 3, lr 1e-5
    r = load_recipe(None, ["run.steps=6", "run.resume=auto", "trainer.lr=2e-5", "trainer.weight_decay=0.01"])
    with caplog.at_level("INFO"):
        resume_from, state = _resume_point(r, run, ck.data_fingerprint([]))
    assert resume_from == run / "checkpoints" / "step_000003" and state.step == 3
    assert "resume changes trainer.lr: 1e-05 -> 2e-05 from step 4 on" in caplog.text
    assert "resume changes trainer.weight_decay: 0.0 -> 0.01 from step 4 on" in caplog.text
    assert "trainer.betas" not in caplog.text
