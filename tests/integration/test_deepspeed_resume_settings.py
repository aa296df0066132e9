"""Optimizer settings changed on resume under DeepSpeed (the torch backend: tests/unit/test_optimizer_resume.py).

``engine.load_checkpoint`` restores the saved param groups (lr 1e-3, betas (0.9, 0.999), weight decay 0) and,
under ZeRO-1/2, the saved clipping norm (1.0); :meth:`PolicyWorker.load_state` must leave the resumed recipe's
values (2e-5, (0.8, 0.99), 0.1, 0.5) in place, and the next update must run. Measured before the change: every
stage kept 1e-3 (and ZeRO-2 the clip 1.0). Each case runs in a child process: a DeepSpeed engine in the test
process would leave torch.distributed state behind for later tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from in_child import call_in_child

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HERE = Path(__file__).resolve().parent
UNIT = HERE.parent / "unit"
NEW = ["trainer.lr=2e-5", "trainer.betas=[0.8, 0.99]", "trainer.weight_decay=0.1", "trainer.grad_clip=0.5"]


def _worker_factory(stage: int):
    """``make(*overrides)``: a one-rank DeepSpeed ZeRO-``stage`` PolicyWorker of tiny_test.yaml's small settings
    (fp32) plus ``overrides``, on the tiny random model; every worker of one factory shares one rendezvous port."""
    import test_optimizer_resume as u

    from rlvr.models import resolve_model
    from rlvr.recipe import load_recipe
    from rlvr.hardware import free_port
    from rlvr.train.policy import PolicyWorker

    model_dir, port = resolve_model("tiny-random"), free_port()
    base = [*u.SMALL, "trainer.backend=deepspeed", f"trainer.zero_stage={stage}", "model.dtype=float32"]
    return lambda *overrides: PolicyWorker(load_recipe(u.TINY, [*base, *overrides]), model_dir, 0, 1, "127.0.0.1", port)


def _resume(stage: int, out_dir: str) -> dict:
    """One update at tiny_test.yaml's settings, saved; a worker of the changed recipe loads it and updates once."""
    import test_optimizer_resume as u

    worker = _worker_factory(stage)
    first = worker()
    first.train_step(u._batch())
    first.save_state(out_dir)
    resumed = worker(*NEW)
    version = resumed.load_state(out_dir)
    opt = resumed.optimizer
    groups = sorted({(g["lr"], tuple(g["betas"]), g["weight_decay"]) for g in opt.param_groups})
    clip = getattr(opt, "clip_grad", getattr(opt, "grad_clip", None))
    stats = resumed.train_step(u._batch())
    return {"version": version, "groups": groups, "clip": clip, "skipped": stats["train/skipped"]}


def _two_updates_vs_resumed(stage: int, out_dir: str) -> dict:
    """Two updates in one worker against one update, saved, then a fresh worker that loads it and takes the second
    (the same batch both times, the same recipe): the resumed weights must be the uninterrupted ones, which holds
    only if Adam's moments and step count came back (fresh moments give a different second step)."""
    import test_optimizer_resume as u

    worker = _worker_factory(stage)
    weights = lambda w: {n: p.detach().clone() for n, p in w.module.named_parameters()}  # noqa: E731
    whole = worker()
    whole.train_step(u._batch())
    one = weights(whole)
    whole.train_step(u._batch())
    two = weights(whole)
    first = worker()
    first.train_step(u._batch())
    first.save_state(out_dir)
    resumed = worker()
    resumed.load_state(out_dir)
    resumed.train_step(u._batch())
    again = weights(resumed)
    return {"gap": max(float((two[n] - again[n]).abs().max()) for n in two),
            "moved": sum(float((two[n] - one[n]).abs().max()) > 1e-5 for n in two), "tensors": len(two)}


@pytest.mark.timeout(300)
def test_resumed_deepspeed_worker_takes_the_uninterrupted_second_update(tmp_path):
    """ZeRO-2 (the GPU recipe's stage): N = 1 + resumed 1 equals N = 2, weight for weight (the loop-level resume
    test, tests/integration/test_resume.py, runs the torch backend)."""
    got = call_in_child("test_deepspeed_resume_settings", "_two_updates_vs_resumed", 2, str(tmp_path / "trainer"),
                        timeout_s=280, path=(UNIT,))
    assert got["moved"] >= got["tensors"] // 2, got  # the second update moved the weights ...
    assert got["gap"] <= 1e-6, got  # ... and the resumed worker moved them the same way


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stage", [0, 2, 3])  # ZeRO-0 fp32: the client optimizer clips; 2: the clip is in the state
def test_resumed_deepspeed_worker_takes_the_new_optimizer_settings(stage, tmp_path):
    got = call_in_child("test_deepspeed_resume_settings", "_resume", stage, str(tmp_path / "trainer"), timeout_s=280,
                        path=(UNIT,))
    assert got["version"] == 1 and got["groups"] == [[2e-5, [0.8, 0.99], 0.1]]
    assert got["clip"] == 0.5 and got["skipped"] == 0.0
