"""Metric names (rlvr/metrics/names.py): no producer spells a name itself, every name a run logs is in the
catalogue, and the catalogue's patterns, the plot panels and the progress line read as they did."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch
from test_loop_order import TINY, _run

from rlvr.metrics import names as mn

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "rlvr"
BOOKKEEPING = {"step"}  # added to every row by the sinks; not a metric
# the brief's namespaces (dph/ is not used today, so nothing may start to use it behind the module's back)
NAMESPACES = set(mn.NAMESPACES) | {"dph"}
_FILE = re.compile(r"\.(jsonl|json|parquet|csv|txt|yaml|yml|py|pt)$")  # "data/gsm8k/test.jsonl" is a path


# -- 1. no metric-name literal outside rlvr/metrics/names.py -------------------------------------------------
def metric_literals(source: str, namespaces=NAMESPACES) -> list[tuple[int, str]]:
    """(line, text) of each string constant or f-string whose text starts with ``namespace/``; docstrings and
    file paths (a name ending in a file extension) are left out."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                skip.add(id(first.value))
        if isinstance(node, ast.JoinedStr):  # its parts are judged as one f-string
            skip |= {id(v) for v in node.values}
    start = re.compile(rf"({'|'.join(map(re.escape, sorted(namespaces)))})/")
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            text = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""
        else:
            continue
        if start.match(text) and not _FILE.search(text):
            out.append((node.lineno, text))
    return out


def test_the_scanner_flags_literals_and_fstrings():
    src = '''"""reward/mean in a docstring is documentation."""
def f(k, m):
    """timing/step_s here too."""
    m["train/loss"] = 1.0
    m[f"passk/{k}"] = 2.0
    m[f"{k}/train/x"] = 3.0
    m["pass@1"] = m["samples/step_1.json"] = m["data/gsm8k/test.jsonl"] = 4.0
    return f"val/pass@{k}", "sync/gbps", "data/epoch", "dph/x"
'''
    assert sorted(metric_literals(src)) == [(4, "train/loss"), (5, "passk/"), (8, "data/epoch"), (8, "dph/x"),
                                            (8, "sync/gbps"), (8, "val/pass@")]
    assert metric_literals('x = "reward/mean"\n', {"train"}) == []  # only the namespaces given


def test_no_metric_name_literal_outside_the_names_module():
    found = {}
    for f in sorted(PKG.rglob("*.py")):
        if f == PKG / "metrics" / "names.py":
            continue
        hits = metric_literals(f.read_text())
        if hits:
            found[str(f.relative_to(ROOT))] = hits
    assert found == {}, f"build these names with rlvr.metrics.names: {found}"


# -- 2. every name a run logs is in the catalogue -----------------------------------------------------------
def _logged(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(tmp_path.rglob("metrics.jsonl")) for line in f.read_text().splitlines()]


@pytest.mark.parametrize("overrides, expect", [
    ((), {mn.REWARD_MEAN, mn.passk(4), mn.reward_score("numeric"), mn.SYNC_PROBE_GAP_MEAN, mn.TIMING_ENGINE_RESTARTS,
          mn.POLICY_VERSION, mn.DATA_EPOCH}),
    (("algorithm.advantage=gae",), {mn.CRITIC_VALUE_LOSS, mn.CRITIC_VALUE_MEAN, mn.CRITIC_RETURN_MEAN, mn.ADV_TOKEN_MEAN}),
    (("validation.every_steps=1", "validation.at_start=true", "data.generated.holdout=8"),
     {mn.val_pass(1), mn.val_pass(8), mn.val_maj(8), mn.val_mean(8), mn.VAL_REWARD_MEAN, mn.TIMING_VALIDATION_S}),
    (("algorithm.dynamic_sampling=true", "algorithm.overlong_filter=true"),
     {mn.DYNAMIC_SAMPLING_ROUNDS, mn.DYNAMIC_SAMPLING_INFORMATIVE_FRAC, mn.RESPONSE_FILTERED_FRAC}),
    (("algorithm.kl_coef=0.1", "algorithm.kl_penalty=reward"), {mn.REWARD_KL_PENALTY_SEQ_MEAN, mn.TRAIN_KL}),
], ids=["grpo", "gae", "validation", "dapo", "kl_in_reward"])  # fmt: skip
def test_every_name_a_fake_loop_logs_is_in_the_catalogue(tmp_path, overrides, expect):
    _run(tmp_path, *overrides)
    rows = _logged(tmp_path)
    assert len(rows) >= 2
    keys = {k for row in rows for k in row}
    assert BOOKKEEPING <= keys and expect <= keys  # the run logged what the test is about
    assert sorted(k for k in keys - BOOKKEEPING if mn.describe(k) is None) == []


def test_validation_at_start_logs_step_zero_with_catalogued_names(tmp_path):
    _run(tmp_path, "validation.every_steps=1", "validation.at_start=true", "data.generated.holdout=8")
    first = _logged(tmp_path)[0]
    assert first["step"] == 0 and first[mn.POLICY_VERSION] == 0.0
    assert all(mn.known(k) for k in first if k not in BOOKKEEPING)


def _batch():
    from rlvr.train.batch import pack
    from rlvr.types import Completion

    comps = [Completion(prompt_index=i // 2, sample_index=i % 2, prompt_ids=[1, 4, 41, 5], token_ids=[6, 7, 2],
                        logprobs=[-1.0, -2.0, -0.5], text="x", finish_reason="stop", policy_version=0)
             for i in range(4)]  # fmt: skip
    return pack(comps, torch.tensor([1.0, -1.0, 0.5, -0.5]), 0, 8)


SMALL = ["run.executor=local", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2", "trainer.micro_batch_size=2"]


def test_every_name_the_real_trainers_return_is_in_the_catalogue():
    """The fakes' trainer returns fixed names; the real policy worker forwards its loss's statistics
    (train/<stat>): KL in the loss, TIS, the dual clip, DPH-RL; the real critic its own."""
    from rlvr.models import resolve_model
    from rlvr.recipe import load_recipe
    from rlvr.train.critic import CriticWorker
    from rlvr.train.policy import PolicyWorker

    model_dir, b = resolve_model("tiny-random"), _batch()
    r = load_recipe(TINY, [*SMALL, "algorithm.kl_coef=0.1", "algorithm.kl_penalty=loss", "algorithm.tis_cap=2.0",
                           "algorithm.policy_loss.dual_clip_c=3.0", "algorithm.dph_divergence=forward_kl",
                           "algorithm.dph_coef=0.1", "algorithm.advantage=gae"])  # fmt: skip
    policy = PolicyWorker(r, model_dir, 0, 1, "127.0.0.1", 0).train_step(b, dph=b)
    zeros = torch.zeros_like(b.loss_mask)
    critic = CriticWorker(r, model_dir).train_step(b, zeros, zeros + 1.0)
    assert {mn.TRAIN_KL, mn.TRAIN_TIS_CAPPED, mn.TRAIN_CLIPPED_DUAL, mn.TRAIN_DPH_DIV, mn.TIMING_TRAIN_INNER_S} <= set(policy)
    assert {mn.CRITIC_VALUE_MSE, mn.CRITIC_GRAD_NORM, mn.TIMING_CRITIC_INNER_S} <= set(critic)
    assert sorted(k for k in [*policy, *critic] if not mn.known(k)) == []


def test_every_registered_policy_loss_statistic_is_in_the_catalogue():
    from rlvr.algos import POLICY_LOSSES
    from rlvr.algos.objective import micro_batch_loss
    from rlvr.recipe import load_recipe

    torch.manual_seed(0)
    lp, old, rollout, ref = (torch.randn(4, 5) - 2.0 for _ in range(4))
    mask = torch.ones(4, 5)
    for loss in POLICY_LOSSES.names():
        for mode in ("tis", "decoupled") if loss == "ppo_clip" else ("tis",):  # decoupled: ppo_clip only
            r = load_recipe(TINY, [*SMALL, f"algorithm.policy_loss={loss}", "algorithm.tis_cap=2.0",
                                   f"algorithm.rollout_correction={mode}"])  # fmt: skip
            out = micro_batch_loss(r.algorithm, lp, old, torch.tensor([1.0, -1.0, 0.5, -0.5]), mask,
                                   rollout_logprobs=rollout, num_tokens=20.0, num_seqs=4.0, max_len=5, ref_logprobs=ref)
            assert sorted(mn.train_stat(k) for k in out.stats if not mn.known(mn.train_stat(k))) == [], (loss, mode)


# -- 3. the module itself ------------------------------------------------------------------------------------
def test_hand_checked_names():
    assert mn.passk(8) == "passk/8"
    assert mn.timing("rollout") == "timing/rollout_s" == mn.TIMING_ROLLOUT_S
    assert mn.reward_score("math#2") == "reward/score/math#2"
    assert mn.train_stat("clipped") == "train/clipped" == mn.TRAIN_CLIPPED
    assert (mn.val_pass(4), mn.val_maj(8), mn.val_mean(8)) == ("val/pass@4", "val/maj@8", "val/mean@8")
    assert mn.describe("val/pass@4").pattern == "val/pass@<k>" == mn.VAL_PASS
    assert mn.describe("val/pass@4").unit == "fraction"
    assert mn.describe("passk/16").pattern == "passk/<k>"
    assert mn.describe("timing/step_s").unit == "seconds"
    assert mn.describe("timing/engine_restarts").unit == "count"
    assert mn.describe("reward/score/verifiers/mine.py:check").pattern == "reward/score/<verifier>"
    assert mn.describe("policy_version").unit == "version"
    for bad in ("nonsense/x", "step", "passk/", "passk/x", "val/pass@", "val/pass@4x", "reward/mean2", "timing/foo_s"):
        assert mn.describe(bad) is None and not mn.known(bad), bad
    assert mn.parse(mn.PASSK, "passk/12") == {"k": "12"} and mn.parse(mn.PASSK, "passk/1x") is None
    assert mn.namespace("sync/gbps") == "sync" and mn.namespace("policy_version") == ""
    with pytest.raises(ValueError, match="unknown placeholder <x>"):
        mn.regex("train/<x>")


def test_the_catalogue_is_whole_and_has_no_duplicates():
    patterns = [e.pattern for e in mn.CATALOGUE]
    assert len(patterns) == len(set(patterns))
    assert all(e.unit and e.meaning for e in mn.CATALOGUE)
    assert {mn.namespace(p) for p in patterns} == set(mn.NAMESPACES) | {""}
    constants = {v for k, v in vars(mn).items() if k.isupper() and isinstance(v, str) and not k.startswith("NS_")}
    # every constant of the module is catalogued; TIMING ("timing/<stage>_s") is catalogued stage by stage
    assert constants - set(patterns) == {mn.TIMING}
    assert {p for p in patterns if mn.parse(mn.TIMING, p) is not None} == {
        mn.timing(s) for s in ("rollout", "reward", "train", "sync", "step", "validation", "judge", "train_inner",
                                       "critic_inner", "train_wait", "refill", "teacher")}
    for p in patterns:  # each entry's own name (placeholders filled) is described by that entry
        concrete = p.replace("<k>", "4").replace("<n>", "8").replace("<verifier>", "numeric").replace("<role>", "engines")
        concrete = concrete.replace("<tool>", "calculator").replace("<outcome>", "timeout")
        assert mn.describe(concrete).pattern == p


# the panel and progress patterns as they were written before the names module: same names, same choices
OLD_PANELS = {
    "reward": r"reward/(mean|correct_frac)", "passk": r"passk/\d+", "val": r"val/(pass@\d+|maj@\d+|mean@\d+)",
    "length": r"response/length_(mean|max)|val/length_mean", "kl": r"train/(kl|rollout_kl_k3|approx_kl)",
    "entropy": r"train/entropy", "clip": r"train/(clip_frac|clipped\w*|tis_capped)",
    "rollout_gap": r"train/rollout_gap_abs(_max)?", "timing": r"timing/\w+_s", "sync": r"sync/gbps",
}


def test_plot_panels_choose_the_names_they_chose_before():
    from rlvr.plot import PANELS

    # the panels of before, then the two of asynchronous rollout (roles' idle seconds, the policy lag), distillation,
    # then multi-turn trajectories and tools
    assert [p.slug for p in PANELS] == [*OLD_PANELS, "idle", "staleness", "distill", "turns", "trajectory_ends",
                                        "tools", "tool_outcomes"]  # fmt: skip
    samples = {e.pattern.replace("<k>", "4").replace("<n>", "8").replace("<verifier>", "numeric").replace("<role>", "engines")
               .replace("<tool>", "calculator").replace("<outcome>", "timeout") for e in mn.CATALOGUE}  # fmt: skip
    samples |= {"tools/calculator/ok", "tools/Session/created", "tools/calculator/okay"}
    samples |= {"train/clip_frac", "train/clipped_x", "train/clippedness", "passk/16", "val/pass@16", "val/maj@x",
                "timing/_s", "timing/a b_s", "reward/mean_x", "xreward/mean", "train/rollout_gap_abs_maxx", "step"}
    new_only = {p.slug: {s for s in samples if re.fullmatch(p.pattern, s)} for p in PANELS if p.slug not in OLD_PANELS}
    assert new_only == {"idle": {"roles/engines_idle_s"}, "staleness": {"async/staleness_mean", "async/staleness_max"},
                        "distill": {"distill/reverse_kl_mean", "distill/reverse_kl_seq_mean"},
                        "turns": {"rollout/turns_mean"},
                        "trajectory_ends": {"rollout/solved_after_turn_1", "rollout/env_failed_frac",
                                            "rollout/prefix_broken_frac",
                                            "rollout/budget_end_frac", "rollout/length_end_frac",
                                            "rollout/stop_id_end_frac"},
                        "tools": {"tools/calls_per_traj", "tools/malformed_frac"},
                        "tool_outcomes": {"tools/calculator/timeout", "tools/calculator/ok"}}  # fmt: skip
    for p in (p for p in PANELS if p.slug in OLD_PANELS):
        old, new = re.compile(OLD_PANELS[p.slug]), re.compile(p.pattern)
        assert {s for s in samples if new.fullmatch(s)} == {s for s in samples if old.fullmatch(s)}, p.slug


def test_headline_and_final_line_keys():
    from rlvr.metrics.progress import headline

    m = {"reward/mean": 0.45, "passk/2": 0.5, "passk/16": 0.9, "passk/x": 1.0, "timing/step_s": 12.34, "sync/gbps": 1.0}
    assert headline(m) == "reward/mean=0.4500 passk/16=0.9000 step_s=12.3"


def test_a_tools_outcome_name_matches_its_pattern_whole():
    """``<outcome>`` is one atom: regex() of ``tools/<tool>/<outcome>`` once read ``tools/[\\w.-]+/ok|error|...``, which
    a full match of ``tools/calculator/error`` failed (only the bare word ``error`` matched); a stateful class's
    instance counts are the same family."""
    rx = re.compile(mn.regex(mn.TOOL_OUTCOME))
    names = ["tools/calculator/ok", "tools/calculator/error", "tools/my.tool-2/timeout", "tools/calculator/crashed",
             "tools/PythonSession/created", "tools/PythonSession/close_error"]
    assert all(rx.fullmatch(n) for n in names)
    assert not any(rx.fullmatch(n) for n in ("error", "tools/calculator/okay", "tools/calls_per_traj", "tools/a/b/ok"))
    assert all(mn.describe(n).pattern == mn.TOOL_OUTCOME for n in names)
    assert mn.parse(mn.TOOL_OUTCOME, "tools/PythonSession/close_error") == {"tool": "PythonSession",
                                                                            "outcome": "close_error"}
    from rlvr.tools.execute import OUTCOMES

    assert mn.TOOL_CALL_OUTCOMES == OUTCOMES  # names.py imports nothing from rlvr: the copy is held to the source
