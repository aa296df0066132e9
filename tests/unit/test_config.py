"""Recipe schema (rlvr.config): unknown keys, dotted overrides, types, invariants, derived sizes, YAML round trip.

Every expected value below is worked out by hand from the recipe numbers (P prompts, G group size,
B = P x G samples per step); the base recipe is recipes/tiny_test.yaml (P=4, G=4, micro batch 8, 1 worker,
max_prompt_tokens 64, max_new_tokens 8, 3 steps).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rlvr.config import (
    Recipe,
    RecipeError,
    RolloutConfig,
    TrainerConfig,
    VerifierSpec,
    dump_yaml,
    parse_override,
    to_dict,
)
from rlvr.recipe import load_recipe, resolve, validate

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny_test.yaml"


def _yaml(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _msg(excinfo: pytest.ExceptionInfo) -> str:
    return str(excinfo.value)


# -- unknown keys ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("trainer:\n  lrr: 1.0e-6\n", "unknown key 'trainer.lrr': did you mean 'trainer.lr'?"),
        ("trainr:\n  lr: 1.0e-6\n", "unknown key 'trainr': did you mean 'trainer'?"),
        (
            "data:\n  generated: {opps: [plus]}\n",
            "unknown key 'data.generated.opps': did you mean 'data.generated.ops'?",
        ),
        (
            "reward:\n  verifiers:\n    - nme: math\n",
            "unknown key 'reward.verifiers[0].nme': did you mean 'reward.verifiers[0].name'?",
        ),
    ],
)
def test_unknown_key_in_yaml_names_full_key_and_nearest(tmp_path, text, expected):
    with pytest.raises(RecipeError) as ei:
        load_recipe(_yaml(tmp_path, text))
    assert _msg(ei) == expected


@pytest.mark.parametrize(
    "override, expected",
    [
        ("trainer.lrr=1e-6", "unknown key 'trainer.lrr': did you mean 'trainer.lr'?"),
        ("trainr.lr=1e-6", "unknown key 'trainr': did you mean 'trainer'?"),
        ("data.generated.opps=[plus]", "unknown key 'data.generated.opps': did you mean 'data.generated.ops'?"),
    ],
)
def test_unknown_key_in_override_names_full_key_and_nearest(override, expected):
    with pytest.raises(RecipeError) as ei:
        load_recipe(TINY, [override])
    assert _msg(ei) == expected


def test_unknown_key_without_near_match_lists_valid_keys(tmp_path):
    with pytest.raises(RecipeError) as ei:
        load_recipe(_yaml(tmp_path, "checkpoint:\n  zzzzzz: 1\n"))
    assert _msg(ei) == "unknown key 'checkpoint.zzzzzz': valid keys under 'checkpoint': every_steps, keep_last, best_metric, best_mode, async_write"
    with pytest.raises(RecipeError) as ei:
        load_recipe(None, ["qqqqqq=1"])
    assert _msg(ei) == (
        "unknown key 'qqqqqq': valid keys under '(top level)': "
        "run, model, data, rollout, reward, algorithm, trainer, sync, timeouts, metrics, validation, critic, checkpoint, "
        "judge, environment, tools, teacher"
    )


# -- overrides and types -----------------------------------------------------------------------------------


def test_parse_override_reads_value_as_yaml():
    assert parse_override("run.steps=5") == ("run.steps", 5)
    assert parse_override("run.name=a=b") == ("run.name", "a=b")  # split at the first '='
    assert parse_override(" run.name = x ") == ("run.name", "x")
    assert parse_override("data.generated.ops=[plus,minus]") == ("data.generated.ops", ["plus", "minus"])
    assert parse_override("data.system_prompt=") == ("data.system_prompt", "")


def test_override_without_equals_is_a_usage_error():
    with pytest.raises(RecipeError) as ei:
        parse_override("run.steps")
    assert "must look like section.key=value" in _msg(ei)
    assert "'run.steps'" in _msg(ei)


def test_override_with_invalid_yaml_value_is_a_recipe_error():
    with pytest.raises(RecipeError) as ei:
        load_recipe(TINY, ["data.generated.ops=[plus,"])
    assert "'data.generated.ops'" in _msg(ei)
    assert "not valid YAML" in _msg(ei)


def test_overrides_convert_types():
    r = load_recipe(
        TINY,
        [
            "trainer.lr=1e-6",
            "run.steps=5",
            "run.save_final=false",
            "metrics.progress=true",
            "data.generated.ops=[plus,minus]",
            "reward.verifiers=[{name: math, weight: 0.5}]",
            "run.num_cpus=2",
            "trainer.betas=[0.8, 0.95]",
            "metrics.pass_k=[1, 4]",
        ],
    )
    assert r.trainer.lr == 1e-6 and type(r.trainer.lr) is float  # YAML 1.1 reads "1e-6" as a string
    assert r.run.steps == 5 and type(r.run.steps) is int
    assert r.run.save_final is False
    assert r.metrics.progress is True
    assert r.data.generated.ops == ("plus", "minus")
    # the override replaces one leaf: the recipe's other generated-task keys stay
    assert (r.data.generated.digits, r.data.generated.size) == (1, 200)
    assert r.reward.verifiers == (VerifierSpec(name="math", weight=0.5, args={}),)
    assert r.run.num_cpus == 2.0 and type(r.run.num_cpus) is float
    assert r.trainer.betas == (0.8, 0.95)
    assert r.metrics.pass_k == (1, 4)


def test_later_override_wins_and_null_sets_optional():
    r = load_recipe(TINY, ["run.steps=5", "run.steps=7", "run.num_cpus=null", "data.limit=12"])
    assert r.run.steps == 7
    assert r.run.num_cpus is None
    assert r.data.limit == 12


@pytest.mark.parametrize(
    "override, expected",
    [
        ("run.steps=abc", "'run.steps' must be an integer, got 'abc'"),
        ("run.steps=2.5", "'run.steps' must be an integer, got 2.5"),
        ("run.save_final=1", "'run.save_final' must be true or false, got 1"),
        ("trainer.lr=fast", "'trainer.lr' must be a number, got 'fast'"),
        ("trainer.betas=[0.9]", "'trainer.betas' must have 2 items, got [0.9]"),
        (
            "trainer.backend=deepspeeed",
            "'trainer.backend' must be one of ['auto', 'deepspeed', 'torch'], got 'deepspeeed' (did you mean 'deepspeed'?)",
        ),
        ("run=5", "'run' must be a mapping of RunConfig fields, got 5"),
        ("reward.verifiers=[{name: math, weight: heavy}]", "'reward.verifiers[0].weight' must be a number, got 'heavy'"),
    ],
)
def test_wrong_type_names_the_key(override, expected):
    with pytest.raises(RecipeError) as ei:
        load_recipe(TINY, [override])
    assert _msg(ei) == expected


def test_recipe_is_frozen():
    r = load_recipe(TINY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.run.steps = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.trainer = TrainerConfig()  # type: ignore[misc]


# -- malformed files ---------------------------------------------------------------------------------------


def test_top_level_list_is_an_error_naming_the_file(tmp_path):
    p = _yaml(tmp_path, "- run\n- model\n", name="listy.yaml")
    with pytest.raises(RecipeError) as ei:
        load_recipe(p)
    assert _msg(ei).startswith(f"{p}: ")
    assert "must be a YAML mapping" in _msg(ei)


def test_yaml_syntax_error_names_the_file(tmp_path):
    p = _yaml(tmp_path, "run:\n  steps: [1,\n", name="broken.yaml")
    with pytest.raises(RecipeError) as ei:
        load_recipe(p)
    assert _msg(ei).startswith(f"{p}: not valid YAML")


def test_empty_file_gives_the_defaults(tmp_path):
    import dataclasses

    from rlvr.hardware import fast_dtype

    loaded = load_recipe(_yaml(tmp_path, ""))
    assert Recipe().model.dtype == "auto"  # resolved at load, to this machine's fast dtype
    assert loaded == resolve(dataclasses.replace(Recipe(), model=dataclasses.replace(Recipe().model, dtype=fast_dtype(0)),
                                                 trainer=dataclasses.replace(Recipe().trainer, backend="torch"),
                                                 judge=dataclasses.replace(Recipe().judge, dtype=fast_dtype(0)),
                                                 teacher=dataclasses.replace(Recipe().teacher, dtype=fast_dtype(0))))


def test_dtype_auto_resolves_and_an_explicit_dtype_is_kept(tmp_path, monkeypatch):
    import rlvr.hardware as hw

    monkeypatch.setattr(hw, "cpu_has_bf16", lambda cpuinfo=None: False)
    assert load_recipe(_yaml(tmp_path, "")).model.dtype == "float32"  # CPU without bf16: fp32
    assert load_recipe(_yaml(tmp_path, "trainer: {num_gpus: 1}\n")).model.dtype == "bfloat16"  # a GPU trainer
    assert load_recipe(_yaml(tmp_path, "model: {dtype: bfloat16}\n")).model.dtype == "bfloat16"  # explicit: kept
    monkeypatch.setattr(hw, "cpu_has_bf16", lambda cpuinfo=None: True)
    assert load_recipe(_yaml(tmp_path, "")).model.dtype == "bfloat16"


def test_backend_auto_is_torch_at_one_rank_and_deepspeed_above(tmp_path):
    assert Recipe().trainer.backend == "auto"
    assert load_recipe(_yaml(tmp_path, "")).trainer.backend == "torch"  # one rank: ZeRO has nothing to partition
    two = load_recipe(_yaml(tmp_path, "trainer: {num_workers: 2}\n"))
    assert (two.trainer.backend, two.trainer.zero_stage) == ("deepspeed", 2)
    assert load_recipe(_yaml(tmp_path, "trainer: {backend: deepspeed}\n")).trainer.backend == "deepspeed"  # kept


def test_cpu_bf16_flags_are_read_from_cpuinfo():
    from rlvr.hardware import cpu_has_bf16, fast_dtype

    epyc_avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c\n"  # this machine's kind of line
    sapphire = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
    assert not cpu_has_bf16(epyc_avx2) and cpu_has_bf16(sapphire)
    assert cpu_has_bf16("Processor : ARMv8\n")  # no x86 flags line: no claim either way
    assert (fast_dtype(0, epyc_avx2), fast_dtype(0, sapphire), fast_dtype(0.5, epyc_avx2)) == ("float32", "bfloat16", "bfloat16")


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_recipe(tmp_path / "nope.yaml")


# -- invariants --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["trainer.mini_batch_size=6"],  # B = 4 x 4 = 16; 16 % 6 = 4
            "trainer.mini_batch_size (6) must divide the samples per step "
            "(prompts_per_step x samples_per_prompt = 16)",
        ),
        (
            ["trainer.num_workers=2", "trainer.micro_batch_size=3"],  # per rank 16 / 2 = 8; 8 % 3 = 2; 2 | 8
            "trainer.micro_batch_size (3) must divide the per-rank mini-batch (8); "
            "e.g. set trainer.micro_batch_size=2",
        ),
        (
            ["trainer.num_workers=3"],  # 16 % 3 = 1
            "the mini-batch (16) must divide evenly over trainer.num_workers (3)",
        ),
        (["rollout.num_engines=0"], "rollout.num_engines must be >= 1"),
        (["trainer.micro_batch_size=0"], "trainer.num_workers and trainer.micro_batch_size >= 1"),
        (["trainer.num_workers=0"], "trainer.num_workers and trainer.micro_batch_size >= 1"),
        (["trainer.mini_batch_size=-4"], "trainer.mini_batch_size must be >= 0 (0: the whole batch)"),
        (
            ["rollout.prompts_per_step=0"],
            "rollout.prompts_per_step and rollout.samples_per_prompt must be >= 1",
        ),
        (["metrics.pass_k=[1, 8]"], "metrics.pass_k has k=8: pass@k needs 1 <= k <= samples_per_prompt (4)"),
        (["metrics.pass_k=[0]"], "metrics.pass_k has k=0: pass@k needs 1 <= k <= samples_per_prompt (4)"),
        (
            ["rollout.samples_per_prompt=1"],
            "algorithm.advantage=grpo compares samples within a group: set rollout.samples_per_prompt >= 2",
        ),
        (
            ["rollout.samples_per_prompt=1", "algorithm.advantage=rloo"],
            "algorithm.advantage=rloo compares samples within a group: set rollout.samples_per_prompt >= 2",
        ),
        (
            ["rollout.num_engines=3"],  # 4 % 3 = 1
            "rollout.prompts_per_step (4) must divide evenly over rollout.num_engines (3)",
        ),
        (
            ["rollout.temperature=0"],
            "rollout.temperature must be > 0 for RL (sampled logprobs); use eval for greedy decoding",
        ),
        (
            ["rollout.temperature=-0.5"],
            "rollout.temperature must be > 0 for RL (sampled logprobs); use eval for greedy decoding",
        ),
        (["algorithm.advantage=grp"], "algorithm.advantage='grp' is not registered: did you mean 'grpo'?"),
        # difflib ratio of 'k4' to 'k1' is 2*1/4 = 0.5 < cutoff 0.6: no suggestion, the choices instead
        (["algorithm.kl_estimator=k4"], "algorithm.kl_estimator='k4' is not registered: choose from ['k1', 'k2', 'k3']"),
        (
            ["algorithm.loss_agg=token_maen"],
            "algorithm.loss_agg='token_maen' is not registered: did you mean 'token_mean'?",
        ),
        (["data.prompt_template=Solve it"], "data.prompt_template must contain {question}"),
        (["reward.verifiers=[]"], "reward.verifiers is empty: name at least one verifier"),
        # issue 9 item 5 (case R2): a truncated sampler's logprobs disagree with the trainer's
        (["rollout.top_p=0.8"], "Train with rollout.top_p: 1.0 and rollout.top_k: -1"),
        (["rollout.top_k=20"], "invalid recipe:\n  - rollout.top_k=20 truncates the sampler"),
        (["rollout.top_p=0.9"], "  - rollout.top_p=0.9 truncates the sampler"),
        # 0 keeps every checkpoint; verl's and OpenRLHF's -1 is no rlvr value
        (["checkpoint.keep_last=-1"], "checkpoint.keep_last=-1 must be >= 1 (keep the newest K) or 0 (keep every "
                                      "checkpoint; rlvr's 'keep all' is 0, not -1)"),
        (["checkpoint.every_steps=-2"], "checkpoint.every_steps=-2 must be >= 0 (0: only at the end)"),
    ],
)
def test_invariant_fails_with_fix_message(overrides, expected):
    with pytest.raises(RecipeError) as ei:
        load_recipe(TINY, overrides)
    assert _msg(ei).startswith("invalid recipe:\n  - ")
    assert expected in _msg(ei)


def test_keep_last_zero_keeps_every_checkpoint_and_loads():
    assert load_recipe(TINY, ["checkpoint.keep_last=0"]).checkpoint.keep_last == 0


def test_unregistered_name_without_near_match_lists_choices():
    with pytest.raises(RecipeError) as ei:
        load_recipe(TINY, ["algorithm.advantage=zzzzzz"])
    assert "algorithm.advantage='zzzzzz' is not registered: choose from" in _msg(ei)
    assert "'grpo'" in _msg(ei) and "'rloo'" in _msg(ei)


def test_all_violations_are_reported_together():
    with pytest.raises(RecipeError) as ei:
        load_recipe(TINY, ["rollout.temperature=0", "rollout.num_engines=3"])
    lines = _msg(ei).splitlines()
    assert lines[0] == "invalid recipe:"
    assert len(lines) == 3
    assert "rollout.num_engines (3)" in lines[1] and "rollout.temperature must be > 0" in lines[2]


def test_micro_batch_larger_than_per_rank_batch_is_allowed():
    # per rank 16 / 1 = 16 < micro 32: one micro-batch holds the whole mini-batch
    r = load_recipe(TINY, ["trainer.micro_batch_size=32"])
    assert r.grad_accum_steps == 1


def test_validate_accepts_a_replaced_recipe_and_rejects_a_bad_one():
    r = load_recipe(TINY)
    good = dataclasses.replace(r, rollout=dataclasses.replace(r.rollout, prompts_per_step=8))
    validate(good)
    bad = dataclasses.replace(r, rollout=dataclasses.replace(r.rollout, top_p=0.0))
    with pytest.raises(RecipeError, match=r"rollout.top_p must be in \(0, 1\]"):
        validate(bad)


# -- derived quantities ------------------------------------------------------------------------------------


def test_derived_for_a_concrete_recipe():
    r = load_recipe(
        TINY,
        [
            "rollout.prompts_per_step=8",
            "rollout.samples_per_prompt=8",
            "trainer.mini_batch_size=32",
            "trainer.micro_batch_size=8",
            "trainer.num_workers=2",
            "algorithm.ppo_epochs=2",
        ],
    )
    # B = 8 x 8 = 64; steps per rollout = 2 epochs x 64/32 = 4; per rank 32/2 = 16 -> 16/8 = 2 micro-batches
    assert r.samples_per_step == 64
    assert r.mini_batch == 32
    assert r.optimizer_steps_per_rollout == 4
    assert r.grad_accum_steps == 2
    assert r.pass_k == (1, 2, 4, 8)
    assert r.derived() == {
        "prompts_per_step": 8,
        "samples_per_step": 64,
        "max_tokens_per_step": 64 * (64 + 8),  # 4608
        "mini_batch_size": 32,
        "optimizer_steps_per_rollout_batch": 4,
        "grad_accum_steps_per_rank": 2,
        "pass_k": [1, 2, 4, 8],
        "total_samples": 64 * 3,  # 192
    }


def test_derived_for_tiny_test_defaults():
    r = load_recipe(TINY)
    # B = 16, mini-batch 0 -> whole batch, 1 epoch -> 1 step; 16 / 8 = 2 micro-batches
    assert (r.samples_per_step, r.mini_batch, r.optimizer_steps_per_rollout, r.grad_accum_steps) == (16, 16, 1, 2)
    assert r.derived()["max_tokens_per_step"] == 1152  # 16 x (64 + 8)
    assert r.derived()["total_samples"] == 48  # 16 x 3


@pytest.mark.parametrize(
    "g, ks",
    [(1, (1,)), (2, (1, 2)), (5, (1, 2, 4, 5)), (6, (1, 2, 4, 6)), (8, (1, 2, 4, 8)), (12, (1, 2, 4, 8, 12))],
)
def test_default_pass_k(g, ks):
    assert Recipe(rollout=RolloutConfig(samples_per_prompt=g)).pass_k == ks


def test_explicit_pass_k_wins():
    r = load_recipe(TINY, ["metrics.pass_k=[2, 3]"])
    assert r.pass_k == (2, 3)


# -- YAML round trip ---------------------------------------------------------------------------------------


def test_dump_yaml_round_trip(tmp_path):
    r = load_recipe(
        TINY,
        [
            "trainer.lr=3e-7",
            "data.system_prompt='You are: careful. #1'",
            "data.prompt_template='Q: {question}\\nA:'",
            "reward.verifiers=[{name: math, weight: 0.5}, {name: numeric, weight: 0.5, args: {tol: 0.01}}]",
            "metrics.pass_k=[1, 3]",
            "run.num_cpus=1.5",
        ],
    )
    p = _yaml(tmp_path, dump_yaml(r), name="dumped.yaml")
    back = load_recipe(p)
    assert back == r
    assert to_dict(back) == to_dict(r)
    assert back.trainer.lr == 3e-7
    assert back.reward.verifiers[1].args == {"tol": 0.01}


def test_names_from_other_frameworks_point_to_rlvr_names():
    with pytest.raises(RecipeError, match=r"unknown key 'trainer.learning_rate': rlvr calls this 'trainer.lr'"):
        load_recipe(None, ["trainer.learning_rate=1e-6"])
    with pytest.raises(RecipeError, match=r"rlvr calls this 'rollout.samples_per_prompt'"):
        load_recipe(None, ["rollout.num_generations=8"])
