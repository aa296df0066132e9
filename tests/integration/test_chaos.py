"""The chaos test (issue 41): a real run under Ray (tiny model, vLLM engine, verifier pool, trainer, fp32) into which
faults are injected at chosen calls (:mod:`rlvr.runtime.chaos`) finishes by itself with the weights of the same run
unfaulted, bit for bit, each step in metrics.jsonl once, and the same rewards step for step: no sample a fault
touched was trained as the policy's outcome.

The faults, in order (the n-th call counts over the whole faulted run):

- step 2: engine0 killed as its rollout is submitted (mid-generation): replaced, given the current weights, the
  rollout retried (seeded: the same samples);
- step 2: SIGTERM to the controller during the update: the step finishes, its checkpoint is written, the run stops;
  relaunched with ``run.resume=auto`` (the scheduler's part);
- step 3: engine0 killed as its weight receive is submitted (mid-sync: trainer rank 0 is broadcasting to a dead
  peer): the sync aborts, the engine is replaced and the sync redone (``sync/redone``);
- step 4: the reward role's process killed as it is asked to score (mid-scoring): every role restarts
  (``run.max_restarts``) from step 3's checkpoint, committed although it was still being written in the
  background when the fault came;
- step 5: trainer rank 0 killed as its update is submitted (mid-update): the run restarts by itself
  (``run.max_restarts``) from step 4's checkpoint and redoes step 5, with the engines and the reward worker it had
  (only the trainer group is started anew);
- step 6: a verifier worker process dies under a sample (SIGKILL's exit, from inside the verifier once armed):
  the sample is scored again on a fresh worker (``reward/rescored_frac``), not trained as a 0.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from rlvr.recipe import load_recipe

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "recipes" / "tiny_test.yaml")
SHAPING = Path(__file__).parent / "shaping_verifiers.py"


def _recipe(out: Path, name: str):
    return load_recipe(TINY, [
        "run.executor=ray", "run.num_cpus=2", "model.dtype=float32", "data.generated.size=8", "run.steps=6",
        "trainer.lr=1e-2", "checkpoint.every_steps=1", "checkpoint.keep_last=2", f"run.output_dir={out}",
        f"run.name={name}", "sync.timeout_s=20", "rollout.max_restarts=3", "run.max_restarts=2",
        "run.restart_backoff_s=0", "checkpoint.async_write=true",
        f"reward.verifiers=[{{name: '{SHAPING}:DigitShareOrDie', args: {{arm: '{out / 'arm'}'}}}}]",
    ])  # fmt: skip


def _run(recipe, plan):
    """Train ``recipe`` with ``plan``'s faults; after a SIGTERM stop, relaunch it with run.resume=auto once."""
    from rlvr.runtime.controller import RunInterrupted, prepare_run_dir
    from rlvr.runtime.restarts import train_with_restarts
    from rlvr.runtime.roles import default_executor

    run_dir = prepare_run_dir(recipe)
    executors = lambda: plan.wrap(default_executor(recipe, run_dir))  # noqa: E731
    try:
        return train_with_restarts(recipe, run_dir, executors), False
    except RunInterrupted:
        recipe = dataclasses.replace(recipe, run=dataclasses.replace(recipe.run, resume="auto"))
        return train_with_restarts(recipe, run_dir, executors), True


def _final(run_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(Path(run_dir, "final").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _rows(run_dir: str) -> list[dict]:
    return [json.loads(x) for x in Path(run_dir, "metrics.jsonl").read_text().splitlines()]


def test_a_faulted_run_ends_where_the_unfaulted_one_does(tmp_path):
    from rlvr.runtime.chaos import Chaos, Fault

    clean, _ = _run(_recipe(tmp_path, "clean"), Chaos([]))
    plan = Chaos([
        Fault("engine0", "generate", 2),  # step 2, mid-generation
        Fault("trainer0", "train_step", 2, "sigterm"),  # step 2: stop after the step (checkpoint), relaunched
        Fault("engine0", "receive_weights", 5),  # step 3's sync (4th: the resumed run's restoring sync), mid-sync
        Fault("reward", "score", 4),  # step 4, mid-scoring: every role restarts from step 3's checkpoint
        Fault("trainer0", "train_step", 5),  # step 5, mid-update: the run restarts from step 4's checkpoint
        Fault("engine0", "generate", 9, "touch", path=str(tmp_path / "arm")),  # step 6: a verifier worker dies
    ])  # fmt: skip
    faulted, relaunched = _run(_recipe(tmp_path, "faulted"), plan)
    assert relaunched and all(f.fired_at for f in plan.faults), plan.faults
    assert (tmp_path / "arm.fired").exists()  # the verifier's worker did die under a sample
    a, b = _final(clean.run_dir), _final(faulted.run_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # exactly: same samples, same updates
    assert any(not torch.equal(a[k], _initial) for k, _initial in _start_weights(faulted.run_dir).items())
    ra, rb = _rows(clean.run_dir), _rows(faulted.run_dir)
    assert [r["step"] for r in rb] == [1, 2, 3, 4, 5, 6]  # each step once, whatever was redone
    assert [r["reward/mean"] for r in rb] == [r["reward/mean"] for r in ra]
    assert [r["sync/redone"] for r in rb] == [0, 0, 1, 0, 0, 0]
    assert rb[5]["reward/rescored_frac"] > 0 and all(r["reward/crash_frac"] == 0 for r in rb)
    log = Path(faulted.run_dir, "train.log").read_text()
    assert log.count("restart 1 of 2 in 0s from ") == 1 and "the reward role's process died" in log
    assert log.count("restart 2 of 2 in 0s from ") == 1 and "trainer0 role's process died" in log
    # each restart from the step before the fault: step 3's checkpoint was still being written in the background
    # when the reward role died during step 4's rollout, and was committed all the same
    assert "restart 1 of 2 in 0s from " + str(Path(faulted.run_dir, "checkpoints", "step_000003")) in log
    assert "restart 2 of 2 in 0s from " + str(Path(faulted.run_dir, "checkpoints", "step_000004")) in log
    # the trainer rank's death kept the engines and the reward worker: only the trainer group was started anew
    assert log.count("the engines and other roles are kept, the trainer group rebuilt") == 1
    assert log.count("trainer group rebuilt in ") == 1
    assert log.count("engines [0] died during the sync: replacing them") == 1


def _start_weights(run_dir: str) -> dict[str, torch.Tensor]:
    """The starting weights (the tiny model's folder, which the run's recipe names)."""
    from safetensors.torch import load_file

    from rlvr.models import resolve_model

    out = {}
    for f in sorted(Path(resolve_model("tiny-random")).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_a_hung_environment_is_left_out_of_the_update_not_trained_as_a_zero(tmp_path):
    """Multi-turn (the guessing game): from step 2 on one environment step hangs, once, past environment.timeout_s:
    its trajectory ends there (``env: timeout``), is counted (``rollout/env_failed_frac``, ``excluded_frac``) and
    left out of the update, the baseline and the reward metrics (the arithmetic: tests/unit/test_infra_failures.py);
    the run goes on, each step once."""
    from rlvr.runtime.chaos import Chaos, Fault
    from rlvr.runtime.controller import prepare_run_dir
    from rlvr.runtime.restarts import train_with_restarts
    from rlvr.runtime.roles import default_executor

    data = tmp_path / "guess.jsonl"
    data.write_text("".join(json.dumps({"question": "guess a number from 1 to 4", "answer": str(i % 4 + 1)}) + "\n"
                            for i in range(8)))
    arm = tmp_path / "env.arm"
    r = load_recipe(TINY, [
        "run.executor=local", "model.dtype=float32", f"data.source={data}", "rollout.prompts_per_step=4",
        "run.steps=3", "run.save_final=false", f"run.output_dir={tmp_path}", "run.name=env",
        f"reward.verifiers=[{{name: '{SHAPING}:digit_share'}}]",
        f"environment.name={Path(__file__).parent / 'chaos_envs.py'}:HangOnceGuess",
        f"environment.args={{arm: '{arm}', low: 1, high: 4}}", "environment.max_turns=3",
        "environment.max_tokens=96", "environment.num_workers=1", "environment.timeout_s=2",
    ])  # fmt: skip
    plan = Chaos([Fault("trainer0", "train_step", 1, "touch", path=str(arm))])  # armed during step 1's update
    run_dir = prepare_run_dir(r)
    train_with_restarts(r, run_dir, lambda: plan.wrap(default_executor(r, run_dir)))
    assert (tmp_path / "env.arm.fired").exists()
    rows = _rows(str(run_dir))
    assert [x["step"] for x in rows] == [1, 2, 3]
    assert [x["rollout/excluded_frac"] for x in rows] == [0.0, 1 / 16, 0.0]
    assert [x["rollout/env_failed_frac"] for x in rows] == [0.0, 1 / 16, 0.0]
