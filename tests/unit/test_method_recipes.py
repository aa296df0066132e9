"""recipes/methods/: one recipe per named method, each on the CPU smoke task of recipes/smoke_cpu.yaml.

Every recipe loads and validates, names registered entries, cites its paper's arXiv id in its header, is named
after its method, and sets the values its header promises (listed here by hand from the papers).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from rlvr.algos import ADVANTAGES, CRITIC_ADVANTAGES, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES
from rlvr.config import dump_yaml
from rlvr.recipe import load_recipe
from rlvr.reward.judge import rule_specs, settings_of

ROOT = Path(__file__).resolve().parents[2]
METHODS = ROOT / "recipes" / "methods"
RECIPES = sorted(METHODS.glob("*.yaml"))

# method -> the arXiv id its header must cite
ARXIV = {
    "grpo": "2402.03300",  # Shao et al. 2024, DeepSeekMath
    "dr_grpo": "2503.20783",  # Liu et al. 2025, Understanding R1-Zero-Like Training
    "dapo": "2503.14476",  # Yu et al. 2025
    "rloo": "2402.14740",  # Ahmadian et al. 2024, Back to Basics
    "reinforce_pp": "2501.03262",  # Hu 2025
    "gspo": "2507.18071",  # Zheng et al. 2025
    "cispo": "2506.13585",  # MiniMax-M1
    "passk": "2508.10751",  # Chen et al. 2025, Pass@k Training
    "pkpo": "2505.15201",  # Walder & Karkhanis 2025
    "ppo": "1707.06347",  # Schulman et al. 2017
    "dph": "2509.07430",  # Li et al. 2025, DPH-RL
    "areal": "2505.24298",  # Fu et al. 2025, AReaL (asynchronous rollout, decoupled PPO)
    "fapo": "2510.22543",  # Ding et al. 2025, FAPO (flawed-positive penalty from a generative judge)
    "distill": "2306.13649",  # Agarwal et al. 2024, GKD (on-policy distillation, reverse KL)
}

# (advantage, policy_loss, loss_agg, kl_coef, optimizer steps per rollout batch)
OBJECTIVE = {
    "grpo": ("grpo", "ppo_clip", "seq_mean_token_mean", 0.04, 1),
    "dr_grpo": ("dr_grpo", "ppo_clip", "seq_mean_token_sum_norm", 0.0, 1),
    "dapo": ("grpo", "ppo_clip", "token_mean", 0.0, 4),  # B = 64, mini-batch 16
    "rloo": ("rloo", "ppo_clip", "seq_mean_token_sum", 0.0, 1),
    "reinforce_pp": ("reinforce_pp", "ppo_clip", "token_mean", 0.0, 1),
    "gspo": ("grpo", "gspo", "seq_mean_token_mean", 0.0, 4),  # GSPO: 4 mini-batches per rollout batch
    "cispo": ("grpo", "cispo", "token_mean", 0.0, 4),
    "passk": ("passk", "ppo_clip", "token_mean", 0.0, 1),
    "pkpo": ("pkpo", "ppo_clip", "token_mean", 0.0, 1),
    "ppo": ("gae", "ppo_clip", "token_mean", 0.01, 1),
    "dph": ("grpo", "ppo_clip", "token_mean", 0.0, 1),
    "areal": ("grpo", "ppo_clip", "token_mean", 0.0, 1),
    "fapo": ("grpo", "ppo_clip", "token_mean", 0.0, 1),
    "distill": ("distill", "ppo_clip", "token_mean", 0.0, 1),
}


def _header(path: Path) -> str:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)


def test_one_recipe_per_method():
    assert {p.stem for p in RECIPES} == set(ARXIV)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_loads_validates_and_round_trips(path, tmp_path):
    r = load_recipe(path)  # runs validate()
    assert r.run.name == path.stem
    dumped = tmp_path / path.name
    dumped.write_text(dump_yaml(r))
    assert load_recipe(dumped) == r


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_names_are_registered(path):
    al = load_recipe(path).algorithm
    assert al.advantage.name in ADVANTAGES or al.advantage.name in CRITIC_ADVANTAGES
    assert al.policy_loss.name in POLICY_LOSSES
    assert al.loss_agg in LOSS_AGGREGATIONS
    assert al.kl_estimator in KL_ESTIMATORS


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_header_cites_the_paper(path):
    head = _header(path)
    assert re.search(r"arXiv \d{4}\.\d{4,5}", head), "header must cite an arXiv id"
    assert f"arXiv {ARXIV[path.stem]}" in head
    assert "Reproduced" in head and "Scaled down" in head


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_is_the_smoke_task(path):
    smoke = load_recipe(ROOT / "recipes" / "smoke_cpu.yaml")
    r = load_recipe(path)
    assert r.model == smoke.model and r.model.path == "smollm2-135m-instruct"
    assert r.data == smoke.data and r.data.generated.digits == 1 and r.data.generated.ops == ("plus",)
    assert dataclasses.replace(r.rollout, max_staleness=0) == smoke.rollout  # areal: asynchronous
    assert (r.rollout.max_staleness > 0) == (path.stem == "areal")
    # fapo adds a judge verifier after the smoke task's rule verifier (which stays the primary one)
    assert dataclasses.replace(r.reward, verifiers=tuple(rule_specs(r.reward.verifiers))) == smoke.reward
    assert (len(r.reward.verifiers) > 1) == (path.stem == "fapo")
    assert (r.trainer.lr, r.trainer.micro_batch_size) == (smoke.trainer.lr, smoke.trainer.micro_batch_size)
    assert (r.run.seed, r.run.steps, r.run.output_dir) == (smoke.run.seed, smoke.run.steps, "runs/methods")


@pytest.mark.parametrize("name", sorted(OBJECTIVE))
def test_recipe_objective(name):
    al = (r := load_recipe(METHODS / f"{name}.yaml")).algorithm
    adv, loss, agg, kl, opt_steps = OBJECTIVE[name]
    assert (al.advantage.name, al.policy_loss.name, al.loss_agg, al.kl_coef) == (adv, loss, agg, kl)
    assert r.optimizer_steps_per_rollout == opt_steps
    # DAPO's fields are on in dapo.yaml only
    assert al.dynamic_sampling == al.overlong_filter == (name == "dapo")
    assert (al.overlong_buffer > 0) == (name == "dapo")


def test_dapo_values():
    al = load_recipe(METHODS / "dapo.yaml").algorithm
    loss, adv = al.policy_loss.settings, al.advantage.settings
    assert (loss.clip_low, loss.clip_high) == (0.2, 0.28)  # Clip-Higher, sec. 3.1
    assert adv.std_normalize and al.kl_coef == 0.0
    assert (al.dynamic_sampling_max_rounds, al.overlong_buffer, al.overlong_penalty) == (3, 16, 0.5)


def test_other_method_values():
    get = lambda n: load_recipe(METHODS / f"{n}.yaml").algorithm  # noqa: E731
    adv = lambda n: get(n).advantage.settings  # noqa: E731
    loss = lambda n: get(n).policy_loss.settings  # noqa: E731
    assert (get("grpo").kl_estimator, adv("grpo").std_normalize) == ("k3", True)
    assert (loss("gspo").clip_low, loss("gspo").clip_high) == (3e-4, 4e-4)
    assert (loss("cispo").clip_low, loss("cispo").clip_high) == (1.0, 4.0)
    assert adv("passk").k == 4 == load_recipe(METHODS / "passk.yaml").rollout.samples_per_prompt // 2
    assert (adv("pkpo").k, adv("pkpo").baseline) == (4, "loo_minus_one")
    for n in ("grpo", "dr_grpo", "rloo", "reinforce_pp", "passk", "pkpo"):
        assert (loss(n).clip_low, loss(n).clip_high) == (0.2, 0.2)


def test_areal_values():
    r = load_recipe(METHODS / "areal.yaml")
    assert (r.rollout.max_staleness, r.algorithm.rollout_correction, r.algorithm.tis_cap) == (1, "decoupled", 5.0)
    assert (r.algorithm.policy_loss.settings.clip_low, r.algorithm.policy_loss.settings.clip_high) == (0.2, 0.2)


def test_ppo_values():
    r = load_recipe(METHODS / "ppo.yaml")
    al = r.algorithm
    gae = al.advantage.settings
    assert (gae.gamma, gae.lam, r.critic.value_clip, gae.whiten) == (1.0, 0.95, 0.2, True)
    assert (al.kl_penalty, al.kl_estimator, al.kl_coef) == ("reward", "k1", 0.01)
    assert r.critic.path is None  # the critic starts from the policy's weights


def test_fapo_values():
    r = load_recipe(METHODS / "fapo.yaml")
    rule, judge = r.reward.verifiers
    assert (rule.name, judge.name, judge.weight) == ("math", "judge", 0.0)  # the judge acts through the penalty
    assert r.algorithm.flawed_penalty == 0.5  # lambda = 1 on the paper's +-1 scale
    js = settings_of(judge)
    assert (js.parse, js.only_correct, js.temperature) == ("boxed_step", True, 0.0)
    assert "{steps}" in js.template and "{gold}" in js.template and "\\boxed{}" in js.template
    assert r.judge.model == "smollm2-135m-instruct"


def test_distill_values():
    r = load_recipe(METHODS / "distill.yaml")
    adv = r.algorithm.advantage.settings
    assert (adv.coef, adv.verifier_weight, adv.clip, adv.student_logprobs) == (1.0, 0.0, 10.0, "rollout")
    assert r.teacher.model == "smollm2-135m-instruct" and r.rollout.temperature == 1.0


def test_dph_values():
    al = load_recipe(METHODS / "dph.yaml").algorithm
    assert (al.dph_divergence, al.dph_coef, al.dph_prompts, al.dph_batch) == ("js", 0.1, 32, 16)
