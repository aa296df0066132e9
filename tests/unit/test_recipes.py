"""Every recipe shipped in recipes/ loads, validates, round-trips through dump_yaml, and has the sizes its
comments promise (worked out by hand from the recipe's numbers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.config import dump_yaml
from rlvr.recipe import load_recipe

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


def test_there_are_recipes():
    assert {p.name for p in RECIPES} >= {"tiny_test.yaml", "smoke_cpu.yaml", "multiturn_cpu.yaml",
                                         "gsm8k_qwen2.5_0.5b_gpu.yaml"}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_loads_validates_and_round_trips(path, tmp_path):
    r = load_recipe(path)  # load_recipe runs validate()
    dumped = tmp_path / path.name
    dumped.write_text(dump_yaml(r))
    assert load_recipe(dumped) == r


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_prompt_template_survives_yaml_escapes(path):
    t = load_recipe(path).data.prompt_template
    assert "{question}" in t
    assert "\b" not in t  # a double-quoted "\boxed" would have become a backspace + "oxed"


# (P, G, mini-batch, optimizer steps per rollout, grad-accum steps per rank, pass_k, total samples)
EXPECTED = {
    # P=4, G=4 -> B=16; whole batch, 1 step; 16/8 = 2 micro-batches; 16 x 3 steps = 48
    "tiny_test.yaml": (4, 4, 16, 1, 2, (1, 2, 4), 48),
    # P=8, G=8 -> B=64; whole batch, 1 step; 64/8 = 8 micro-batches; 64 x 20 = 1280
    "smoke_cpu.yaml": (8, 8, 64, 1, 8, (1, 2, 4, 8), 1280),
    # smoke_cpu's sizes; a sample is a trajectory of up to 3 turns
    "multiturn_cpu.yaml": (8, 8, 64, 1, 8, (1, 2, 4, 8), 1280),
    # P=64, G=8 -> B=512; mini 256 -> 2 steps; 256/4 = 64 micro-batches; 512 x 100 = 51200
    "gsm8k_qwen2.5_0.5b_gpu.yaml": (64, 8, 256, 2, 64, (1, 2, 4, 8), 51200),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recipe_derived_sizes(name):
    r = load_recipe(Path(RECIPES[0]).parent / name)
    p, g, mb, opt, accum, ks, total = EXPECTED[name]
    assert (r.rollout.prompts_per_step, r.rollout.samples_per_prompt) == (p, g)
    assert r.samples_per_step == p * g
    assert r.mini_batch == mb
    assert r.optimizer_steps_per_rollout == opt
    assert r.grad_accum_steps == accum
    assert r.pass_k == ks
    assert r.derived()["total_samples"] == total


def test_multiturn_recipe_dry_runs(tmp_path, monkeypatch, capsys):
    """recipes/multiturn_cpu.yaml passes --dry-run: the environment resolves and takes its args, and the first
    prompt plus the trajectory budget fit the model's context (smoke_cpu's task, so its data and verifier)."""
    from rlvr.cli import main

    monkeypatch.chdir(tmp_path)
    r = load_recipe(Path(RECIPES[0]).parent / "multiturn_cpu.yaml")
    assert (r.environment.name, r.environment.max_turns) == ("feedback", 3)
    assert r.data == load_recipe(Path(RECIPES[0]).parent / "smoke_cpu.yaml").data
    assert main(["train", str(Path(RECIPES[0]).parent / "multiturn_cpu.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "checked: environment feedback resolves and takes environment.args" in out
    assert "checked: model smollm2-135m-instruct context 8192 >= 128 + 256" in out
    assert out.splitlines()[-1].startswith("dry run: recipe valid")
    assert list(tmp_path.iterdir()) == []  # no run folder
