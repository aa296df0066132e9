"""``rlvr eval`` metrics against hand-worked values: pass@k / maj@k / mean@k per problem, the bootstrap interval,
and the data-set and command-line plumbing that needs no engine."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.cli import main
from rlvr.eval_cli import add_eval_parser, config_from_args, results_table
from rlvr.evaluate import EVAL_PROMPTS, PRESETS, metric_table, model_label, resolve_sets
from rlvr.metrics.intervals import bootstrap_ci
from rlvr.runtime.validation import maj_at_k, majority_correct, problem_metrics

# ------------------------------------------------------------------------------------------------------
# per-problem metrics


def test_one_problem_n4_where_majority_and_pass_differ():
    # answers 7 (correct), 5, 5, none. pass@k = 1 - C(3, k) / C(4, k): 1/4, 1/2, 3/4, 1.
    # maj@k by listing the k-subsets (a = the 7, b/c = the two 5s, d = the blank):
    #   k=1: a -> 1, b, c, d -> 0: 1/4.   k=2: ab, ac tie 1:1 -> 1/2 each; ad -> 1; bc, bd, cd -> 0: 2/6 = 1/3.
    #   k=3: abc -> 0 (5 wins 2:1); abd, acd tie -> 1/2 each; bcd -> 0: 1/4.   k=4: 5 wins 2:1 -> 0.
    m = problem_metrics([[True, False, False, False]], [["7", "5", "5", None]], ks=[1, 2, 3, 4])
    assert [m[f"pass@{k}"][0] for k in (1, 2, 3, 4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert [m[f"maj@{k}"][0] for k in (1, 2, 3, 4)] == pytest.approx([0.25, 1 / 3, 0.25, 0.0])
    assert [m[f"mean@{k}"][0] for k in (1, 2, 3, 4)] == pytest.approx([0.25] * 4)


def test_tie_counts_half_where_the_single_vote_breaks_it_by_order():
    parsed, correct = ["3", "4", "3", "4"], [True, False, True, False]
    # k=2: 33 -> 1, 44 -> 0, four mixed pairs tie -> 1/2 each: (1 + 0 + 2) / 6 = 1/2
    # k=3: 334 (two ways) -> 1, 344 (two ways) -> 0: 1/2;  k=4: tie 2:2 -> 1/2
    assert [maj_at_k(parsed, correct, k) for k in (1, 2, 3, 4)] == pytest.approx([0.5, 0.5, 0.5, 0.5])
    assert majority_correct(parsed, correct) is True  # the one vote over the list: first seen (3) wins the tie


def test_correct_answers_vote_together():
    # 12 and 12.0 are both correct: one vote for the gold, 2:1 against the wrong 5
    parsed, correct = ["12", "12.0", "5"], [True, True, False]
    assert maj_at_k(parsed, correct, 3) == 1.0
    # k=2: {12, 12.0} -> 1; {12, 5}, {12.0, 5} tie -> 1/2 each: 2/3
    assert maj_at_k(parsed, correct, 2) == pytest.approx(2 / 3)
    assert majority_correct(parsed, correct) is True
    # two different wrong answers do not add up: 1:1:1 tie -> 1/3; "9" twice beats the gold
    assert maj_at_k(["1", "2", "3"], [True, False, False], 3) == pytest.approx(1 / 3)
    assert maj_at_k(["1", "9", "9"], [True, False, False], 3) == 0.0
    # nobody votes: 0; a correct sample with no parsed answer still votes for the gold
    assert maj_at_k([None, None], [False, False], 2) == 0.0
    assert maj_at_k([None, None, "4"], [True, False, False], 3) == pytest.approx(1 / 2)


def test_problem_metrics_errors():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        maj_at_k(["1"], [True], 2)
    with pytest.raises(ValueError, match="every k"):
        problem_metrics([[True, False]], [["1", "2"]], ks=[3])
    with pytest.raises(ValueError, match="P >= 1"):
        problem_metrics([], [], ks=[1])


def _brute_force_maj(parsed, correct, k):
    """Every k-subset voted on explicitly; ties credit 1/t (an enumeration, not the counting programme)."""
    total, count = Fraction(0), 0
    for subset in itertools.combinations(range(len(parsed)), k):
        votes: dict[object, int] = {}
        for i in subset:
            key = "GOLD" if correct[i] else parsed[i]
            if key is not None:
                votes[key] = votes.get(key, 0) + 1
        count += 1
        if votes.get("GOLD", 0) and votes["GOLD"] == max(votes.values()):
            total += Fraction(1, sum(1 for v in votes.values() if v == votes["GOLD"]))
    return float(total / count)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["1", "2", "3", None])), min_size=1, max_size=8), st.data())
def test_maj_at_k_matches_enumeration(samples, data):
    correct = [c for c, _ in samples]
    parsed = [p for _, p in samples]
    k = data.draw(st.integers(1, len(samples)))
    value = maj_at_k(parsed, correct, k)
    assert value == pytest.approx(_brute_force_maj(parsed, correct, k), abs=1e-12)
    m = problem_metrics([correct], [parsed], ks=[1, k])
    assert m["maj@1"][0] == pytest.approx(sum(correct) / len(correct))  # one sample: its own correctness
    assert value <= m[f"pass@{k}"][0] + 1e-12  # a correct vote needs a correct sample among the k


# ------------------------------------------------------------------------------------------------------
# bootstrap interval


def test_bootstrap_all_problems_equal_gives_zero_width():
    lo, hi = bootstrap_ci([0.5] * 20)
    assert lo == hi == 0.5
    lo2, hi2 = bootstrap_ci(np.array([[1.0, 0.25]] * 7))
    assert lo2.tolist() == hi2.tolist() == [1.0, 0.25]


def test_bootstrap_hand_worked_binomial_ends():
    # P = 4 problems, values 0, 0, 0, 1: a resample's mean is Binomial(4, 1/4) / 4:
    #   P(0) = 0.316, P(1/4) = 0.422, P(1/2) = 0.211, P(3/4) = 0.047, P(1) = 0.004; cumulative at 1/2: 0.949.
    # So the 2.5% quantile is 0 and the 97.5% quantile is 3/4 (0.949 < 0.975 < 0.996), 25 order statistics
    # (about 3.5 standard deviations of the count) away from either boundary for 1000 resamples.
    lo, hi = bootstrap_ci([0.0, 0.0, 0.0, 1.0], resamples=1000, seed=0)
    assert (lo, hi) == (0.0, 0.75)
    # P = 2, values 0 and 1: mean 0 or 1 each with probability 1/4, so the ends are 0 and 1
    assert bootstrap_ci([0.0, 1.0], resamples=1000, seed=3) == (0.0, 1.0)


def test_bootstrap_is_deterministic_for_a_seed_and_shares_resamples_across_columns():
    rng = np.random.default_rng(11)
    values = rng.random((30, 3))
    values[:, 2] = values[:, 0]  # a duplicated column must get the same interval (same resampled problems)
    a = bootstrap_ci(values, seed=5)
    b = bootstrap_ci(values, seed=5)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert a[0][0] == a[0][2] and a[1][0] == a[1][2]
    c = bootstrap_ci(values, seed=6)
    assert not np.array_equal(a[0], c[0])
    mean = values.mean(axis=0)
    assert np.all(a[0] <= mean) and np.all(mean <= a[1]) and np.all(a[0] < a[1])


def test_bootstrap_errors():
    for bad in ([], [[[1.0]]], [1.0, float("nan")]):
        with pytest.raises(ValueError):
            bootstrap_ci(bad)
    with pytest.raises(ValueError):
        bootstrap_ci([1.0], level=1.0)


def _cfg(*flags: str, model: str = "m"):
    """The EvalConfig ``rlvr eval MODEL FLAGS...`` builds (the command line's own parser)."""
    import argparse

    parser = argparse.ArgumentParser()
    add_eval_parser(parser.add_subparsers())
    return config_from_args(parser.parse_args(["eval", model, *flags]))


def test_metric_table_means_and_intervals():
    cfg = _cfg("--data", "gsm8k")
    table = metric_table({"pass@1": [0.0, 0.0, 0.0, 1.0], "maj@1": [0.5] * 4}, cfg)
    assert table["pass@1"] == {"value": 0.25, "ci": [0.0, 0.75]}  # as the hand-worked bootstrap above
    assert table["maj@1"] == {"value": 0.5, "ci": [0.5, 0.5]}


# ------------------------------------------------------------------------------------------------------
# data sets and the command line (no engine)


def test_presets_and_file_sets(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"q": "1+1?", "a": 2}\n')
    cfg = _cfg("--data", "gsm8k", "svamp", str(f), "gsm8k", "--question-field", "q", "--answer-field", "a",
               "--verifier", "numeric")  # fmt: skip
    sets = resolve_sets(cfg)
    assert [s.name for s in sets] == ["gsm8k", "svamp", "mine", "gsm8k#2"]
    assert sets[0] == PRESETS["gsm8k"] and sets[0].answer_format == "gsm8k" and sets[0].verifier == "math"
    assert sets[1].question == "{Body} {Question}" and sets[1].answer == "Answer"  # presets ignore the field flags
    assert (sets[2].question, sets[2].answer, sets[2].verifier) == ("q", "a", "numeric")
    assert resolve_sets(_cfg("--data", "data/svamp/test.jsonl"))[0].name == "svamp/test"
    with pytest.raises(FileNotFoundError, match="presets: gsm8k"):
        resolve_sets(_cfg("--data", "nowhere.jsonl"))


def test_a_set_name_near_a_preset_is_a_typo():
    # difflib ratios (2M/T, cutoff 0.6): 'gsm8kk' ~ 'gsm8k' 10/11; 'math50' ~ 'math500' 12/13; 'aime2025' ~
    # 'aime25' 12/14 against 'aime24' 10/14
    for typo, preset in (("gsm8kk", "gsm8k"), ("math50", "math500"), ("aime2025", "aime25")):
        with pytest.raises(ValueError, match=f"--data '{typo}': not a preset, nor a file or folder; did you mean "
                                             f"'{preset}'\\? \\(presets: gsm8k, svamp"):
            resolve_sets(_cfg("--data", typo))
    # a path-like entry: the nearest file beside it ('tset.jsonl' ~ 'test.jsonl' 18/20), or the nearest preset
    with pytest.raises(FileNotFoundError, match=r"Did you mean 'data/gsm8k/test\.jsonl'\?"):
        resolve_sets(_cfg("--data", "data/gsm8k/tset.jsonl"))
    with pytest.raises(FileNotFoundError, match=r"Did you mean 'svamp'\?"):  # 'svamp.jsonl' ~ 'svamp' 10/16
        resolve_sets(_cfg("--data", "svamp.jsonl"))
    # org/name and names near no preset stay `datasets` names (loaded, or refused, later)
    assert [s.name for s in resolve_sets(_cfg("--data", "openai/gsm8kk", "zzzz"))] == ["openai/gsm8kk", "zzzz"]


def test_model_label():
    assert model_label("smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert model_label("HuggingFaceTB/SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"
    assert model_label("runs/svamp_cpu/final/") == "svamp_cpu-final"
    assert model_label("runs/svamp_cpu/checkpoints/step_000004/trainer/hf") == "svamp_cpu-step_000004"


# ------------------------------------------------------------------------------------------------------
# rlvr eval RUN: the run's template, verifiers and dtype


def _run_folder(tmp_path, *extra):
    """A run folder as a run writes it: recipe.yaml, final/ and one complete checkpoint with its own recipe
    (stand-in policies: a config.json is all the resolution looks for); ``extra``: more overrides of its recipe."""
    from rlvr.config import dump_yaml
    from rlvr.recipe import load_recipe

    tiny = "recipes/tiny_test.yaml"
    trained = ["data.prompt_template='Q: {question} A:'", "data.system_prompt=Be brief.", "model.dtype=float32",
               "reward.verifiers=[{name: numeric, args: {tolerance: 0.01}}, {name: math, weight: 0.5}]", *extra]  # fmt: skip
    run = tmp_path / "runs" / "mine"
    step = run / "checkpoints" / "step_000002"
    (step / "trainer" / "hf").mkdir(parents=True)
    (run / "recipe.yaml").write_text(dump_yaml(load_recipe(tiny, trained)))
    # the checkpoint's own recipe: read for its policy (a different template here, to see which file is read)
    (step / "recipe.yaml").write_text(dump_yaml(load_recipe(tiny, [*trained, "data.prompt_template='S: {question}'"])))
    (step / "trainer" / "hf" / "config.json").write_text("{}")
    (step / "COMPLETE").write_text("{}")
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")
    return run, step


def test_eval_of_a_run_takes_its_template_verifiers_and_dtype(tmp_path, caplog):
    run, _ = _run_folder(tmp_path)
    with caplog.at_level("INFO", logger="rlvr.eval"):
        cfg = _cfg("--data", "gsm8k", model=str(run))
    assert cfg.model.path == str(run / "final") and cfg.model.dtype == "float32"
    assert (cfg.prompts.prompt_template, cfg.prompts.system_prompt, cfg.prompts.chat_template) == (
        "Q: {question} A:", "Be brief.", True)
    assert [(v.name, v.args, v.weight) for v in cfg.reward.verifiers] == [("numeric", {"tolerance": 0.01}, 1.0),
                                                                          ("math", {}, 0.5)]  # fmt: skip
    # the rest stays the eval defaults (tiny_test.yaml has 4 samples, 8 new tokens, 1 scoring worker)
    assert (cfg.n, cfg.rollout.max_new_tokens, cfg.fit_new_tokens, cfg.reward.num_workers, cfg.seed) == (8, 512, True, 2, 0)
    assert cfg.prompts.max_prompt_tokens == EVAL_PROMPTS.max_prompt_tokens
    assert f"{run} is a run folder: evaluating its final/, {run / 'final'}" in caplog.text
    assert "data.prompt_template='Q: {question} A:'" in caplog.text and "model.dtype='float32'" in caplog.text
    assert "reward.verifiers=['numeric', 'math']" in caplog.text and "flags given instead" not in caplog.text
    # RUN/final itself: the same
    assert _cfg("--data", "gsm8k", model=str(run / "final")).prompts.prompt_template == "Q: {question} A:"


def test_eval_of_a_run_flags_win(tmp_path, caplog):
    run, _ = _run_folder(tmp_path)
    with caplog.at_level("INFO", logger="rlvr.eval"):
        cfg = _cfg("--data", "gsm8k", "--dtype", "bfloat16", "--prompt-template", "X {question}", "--verifier", "math",
                   model=str(run))  # fmt: skip
    assert (cfg.model.dtype, cfg.prompts.prompt_template, cfg.prompts.system_prompt) == ("bfloat16", "X {question}", "Be brief.")
    # another verifier by name: the run's first verifier's arguments do not carry over to it
    assert [(v.name, v.args) for v in cfg.reward.verifiers] == [("math", {}), ("math", {})]
    assert "flags given instead: --prompt-template, --verifier, --dtype" in caplog.text
    assert "data.system_prompt='Be brief.'" in caplog.text and "model.dtype=" not in caplog.text
    # --recipe wins over the run's recipe whole
    with caplog.at_level("INFO", logger="rlvr.eval"):
        cfg = _cfg("--data", "gsm8k", "--recipe", "recipes/smoke_cpu.yaml", model=str(run))
    from rlvr.recipe import load_recipe

    assert cfg.prompts.prompt_template == load_recipe("recipes/smoke_cpu.yaml").data.prompt_template
    assert cfg.model.path == str(run / "final") and "the run's own" in caplog.text


def test_eval_of_a_run_reads_a_file_in_the_runs_training_format(tmp_path, caplog):
    """`rlvr eval RUN --data own.jsonl` (issue 24): the run's data.question / data.answer / data.answer_format read
    the file's rows, as in training (before, rows in the training format failed: no field 'question'); presets keep
    their own fields; a flag wins."""
    from transformers import AutoTokenizer

    from rlvr.evaluate import load_set
    from rlvr.models import resolve_model

    run, _ = _run_folder(tmp_path, "data.question=problem", "data.answer=solution", "data.answer_format=gsm8k")
    own = tmp_path / "own.jsonl"
    own.write_text('{"problem": "1+1?", "solution": "One and one. #### 2"}\n')
    with caplog.at_level("INFO", logger="rlvr.eval"):
        cfg = _cfg("--data", str(own), "gsm8k", model=str(run))
    mine, preset = resolve_sets(cfg)
    assert (mine.question, mine.answer, mine.answer_format) == ("problem", "solution", "gsm8k")
    assert preset == PRESETS["gsm8k"]
    assert "data.question='problem', data.answer='solution', data.answer_format='gsm8k'" in caplog.text
    loaded = load_set(mine, cfg, AutoTokenizer.from_pretrained(resolve_model("tiny-random")), 64)
    assert [(p.gold, p.row["problem"]) for p in loaded.prompts] == [("2", "1+1?")]
    flagged = resolve_sets(_cfg("--data", str(own), "--question-field", "q", "--answer-format", "raw", model=str(run)))
    assert (flagged[0].question, flagged[0].answer, flagged[0].answer_format) == ("q", "solution", "raw")


def test_eval_of_a_run_without_final_takes_the_newest_checkpoint(tmp_path, caplog):
    import shutil

    run, step = _run_folder(tmp_path)
    shutil.rmtree(run / "final")
    with caplog.at_level("INFO", logger="rlvr.eval"):
        cfg = _cfg("--data", "gsm8k", model=str(run))
    assert cfg.model.path == str(step / "trainer" / "hf")
    assert cfg.prompts.prompt_template == "S: {question}"  # the checkpoint's own recipe.yaml
    assert "is a run folder: evaluating its newest checkpoint step_000002 (it has no final/)" in caplog.text
    assert f"from {step / 'recipe.yaml'}" in caplog.text
    assert _cfg("--data", "gsm8k", model=str(step)).model.path == str(step / "trainer" / "hf")  # a checkpoint folder
    # a run with no policy yet is an error saying what it lacks; a model folder outside a run takes the defaults
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(ValueError, match="holds no model"):
        _cfg("--data", "gsm8k", model=str(run))
    plain_model = tmp_path / "model"
    plain_model.mkdir()
    (plain_model / "config.json").write_text("{}")
    cfg = _cfg("--data", "gsm8k", model=str(plain_model))
    assert cfg.prompts == EVAL_PROMPTS and cfg.model.dtype == "auto"


def test_config_checks():
    with pytest.raises(ValueError, match="greedy"):
        _cfg("--data", "gsm8k", "--temperature", "0", "--engine", "hf").check()
    with pytest.raises(ValueError, match="--n"):
        _cfg("--data", "gsm8k", "--n", "0").check()
    with pytest.raises(ValueError, match="{question}"):
        _cfg("--data", "gsm8k", "--prompt-template", "hi").check()
    with pytest.raises(ValueError, match="--n 1"):
        _cfg("--data", "gsm8k", "--temperature", "0", "--n", "4").check()  # vLLM refuses n > 1 when greedy
    _cfg("--data", "gsm8k", "--temperature", "0", "--n", "1").check()


def test_eval_defaults_without_a_recipe():
    cfg = _cfg("--data", "gsm8k")
    assert (cfg.n, cfg.rollout.temperature, cfg.rollout.max_new_tokens, cfg.seed) == (8, 1.0, 512, 0)
    assert cfg.fit_new_tokens  # the default 512 is fitted to the model's context; a flag or a recipe is not
    assert not _cfg("--data", "gsm8k", "--max-new-tokens", "512").fit_new_tokens
    assert not _cfg("--data", "gsm8k", "--recipe", "recipes/smoke_cpu.yaml").fit_new_tokens
    assert cfg.prompts == EVAL_PROMPTS and cfg.prompts.prompt_template.endswith("within \\boxed{}.")
    assert (cfg.model.path, cfg.model.dtype, cfg.reward.timeout_s, cfg.reward.verifiers[0].name) == ("m", "auto", 10.0, "math")


def test_eval_takes_the_recipe_sections_and_flags_override():
    from rlvr.recipe import load_recipe

    r = load_recipe("recipes/smoke_cpu.yaml")
    cfg = _cfg("--data", "gsm8k", "--recipe", "recipes/smoke_cpu.yaml")
    assert cfg.prompts.prompt_template == r.data.prompt_template and cfg.prompts.system_prompt == r.data.system_prompt
    assert (cfg.prompts.max_prompt_tokens, cfg.prompts.split, cfg.prompts.limit) == (r.data.max_prompt_tokens, "test", None)
    assert (cfg.n, cfg.rollout.temperature) == (r.validation.samples, r.validation.temperature)  # as validation samples
    assert (cfg.rollout.max_new_tokens, cfg.rollout.engine) == (r.rollout.max_new_tokens, r.rollout.engine)
    assert (cfg.reward, cfg.seed, cfg.model.dtype) == (r.reward, r.run.seed, r.model.dtype)
    cfg = _cfg("--data", "gsm8k", "--recipe", "recipes/smoke_cpu.yaml", "--n", "2", "--max-new-tokens", "32",
               "--seed", "7", "--verifier", "numeric", "--prompt-template", "Q: {question}")  # fmt: skip
    assert (cfg.n, cfg.rollout.max_new_tokens, cfg.seed, cfg.reward.verifiers[0].name) == (2, 32, 7, "numeric")
    assert cfg.prompts.prompt_template == "Q: {question}" and cfg.rollout.temperature == r.validation.temperature


def test_token_budgets_fit_the_context_by_hand():
    from rlvr.models import token_budgets

    # fitted (no --max-new-tokens): prompt budget min(P, ctx // 2), new = min(512, ctx - budget), limit
    # min(P, ctx - new). SmolLM2 (8192): budget 1024, new min(512, 7168) = 512, limit min(1024, 7680) = 1024
    assert token_budgets(8192, 1024, 512, fit=True) == (1024, 512)
    # tiny-random (512): budget min(1024, 256) = 256, new min(512, 256) = 256, limit min(1024, 256) = 256
    assert token_budgets(512, 1024, 512, fit=True) == (256, 256)
    # 1200: budget 600, new min(512, 600) = 512, limit min(1024, 688) = 688
    assert token_budgets(1200, 1024, 512, fit=True) == (688, 512)
    # --max-prompt-tokens 100 on 512: budget 100, new min(512, 412) = 412, limit min(100, 100) = 100
    assert token_budgets(512, 100, 512, fit=True) == (100, 412)
    # given: kept; the prompt limit takes what is left: min(1024, 512 - 300) = 212
    assert token_budgets(512, 1024, 300, fit=False) == (212, 300)
    assert token_budgets(None, 1024, 4096, fit=False) == (1024, 4096)  # no max_position_embeddings
    # given and too long: 512 new tokens in 512 positions leave none for a prompt; at most 511, e.g. 512 - 256
    with pytest.raises(ValueError, match=r"512 new tokens .* leave no room for a prompt in the model's 512-token "
                                         r"context .*: lower it \(at most 511, e\.g\. 256 to keep 256 tokens for the "
                                         r"prompt\), or leave --max-new-tokens out"):
        token_budgets(512, 1024, 512, fit=False)


def test_tiny_random_context_is_read_from_its_config():
    from rlvr.models import context_limit, resolve_model

    assert context_limit(resolve_model("tiny-random")) == 512  # rlvr/models/tiny.py: max_position_embeddings


def test_cli_bad_input_is_one_line_and_no_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "tiny-random", "--data", "missing.jsonl"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["eval", "tiny-random", "--data", "gsm8k", "--verifier-args", "[1]"]) == 2
    assert "JSON object" in capsys.readouterr().err
    assert main(["eval", "tiny-random", "--data", "gsm8k", "--temperature", "-1"]) == 2
    assert list(tmp_path.iterdir()) == []


def test_results_table_cells():
    from rich.console import Console

    m = {f"{name}@{k}": {"value": 0.5, "ci": [0.25, 0.75]} for name in ("pass", "maj", "mean") for k in (1, 2)}
    stats = {"length_mean": 12.0, "truncated_frac": 0.5, "no_answer_frac": 0.25}
    ds = {"problems": 3, "metrics": m, "stats": stats, "timing": {"seconds_per_problem": 1.5}}
    results = {"model": "tiny", "datasets": {"a": ds, "b": ds}, "overall": {"problems": 6, "metrics": m},
               "settings": {"n": 2, "temperature": 1.0, "max_new_tokens": 8,
                            "interval": {"level": 0.95, "resamples": 1000}}}  # fmt: skip
    console = Console(width=200, record=True)
    console.print(results_table(results))
    text = console.export_text()
    assert "0.500 [0.250, 0.750]" in text and "overall (pooled)" in text
    rows = {line.split("│")[1].strip(): line for line in text.splitlines() if line.count("│") >= 4}
    assert set(rows) >= {"problems", "pass@1", "pass@2", "maj@2", "mean@2", "truncated", "no answer"}
    assert "maj@1" not in rows  # equal to pass@1 by definition
    assert "50.0%" in rows["truncated"] and "25.0%" in rows["no answer"]



def test_eval_environment_from_flags_a_run_and_a_recipe(tmp_path, caplog):
    """Multi-turn eval (issue 25): --environment and its flags, a run's own environment section (its args kept,
    flags on top), another environment's args not inherited, and the flags refused without an environment."""
    cfg = _cfg("--data", "gsm8k", "--environment", "guess", "--env-args", '{"low": 1, "high": 4}', "--max-turns", "3",
               "--max-trajectory-tokens", "96")  # fmt: skip
    e = cfg.environment
    assert (e.enabled, e.name, e.args, e.max_turns, e.max_tokens) == (True, "guess", {"low": 1, "high": 4}, 3, 96)
    assert not _cfg("--data", "gsm8k").environment.enabled  # single-turn by default
    with pytest.raises(ValueError, match="need --environment"):
        _cfg("--data", "gsm8k", "--max-turns", "3")
    with pytest.raises(ValueError, match="--env-args must be a JSON object"):
        _cfg("--data", "gsm8k", "--environment", "guess", "--env-args", "[1]")
    with pytest.raises(ValueError, match="--max-turns must be >= 1"):
        _cfg("--data", "gsm8k", "--environment", "guess", "--max-turns", "0").check()
    with pytest.raises(ValueError, match="environment.max_tokens"):
        _cfg("--data", "gsm8k", "--environment", "guess", "--max-trajectory-tokens", "8").check()  # < 512 new tokens

    run, _ = _run_folder(tmp_path, "environment.name=guess", "environment.args={low: 2, high: 9}",
                         "environment.max_turns=5")  # fmt: skip
    with caplog.at_level("INFO", logger="rlvr.eval"):
        cfg = _cfg("--data", "gsm8k", model=str(run))
    assert (cfg.environment.name, cfg.environment.args, cfg.environment.max_turns) == ("guess", {"low": 2, "high": 9}, 5)
    assert cfg.rollout.max_new_tokens == 8  # the run's turn length (tiny_test.yaml), not eval's 512 (a new user hit
    # "environment.max_tokens (256) >= --max-new-tokens (512)" evaluating recipes/multiturn_cpu.yaml's run)
    assert _cfg("--data", "gsm8k", "--max-new-tokens", "4", model=str(run)).rollout.max_new_tokens == 4
    assert "environment='guess'" in caplog.text
    cfg = _cfg("--data", "gsm8k", "--max-turns", "2", model=str(run))
    assert (cfg.environment.args, cfg.environment.max_turns) == ({"low": 2, "high": 9}, 2)
    cfg = _cfg("--data", "gsm8k", "--environment", "feedback", model=str(run))  # the run's guess args do not apply
    assert (cfg.environment.name, cfg.environment.args) == ("feedback", {})


def test_eval_tools_from_flags_a_run_and_none(tmp_path):
    """Tool use in rlvr eval (issue 26): --tools names them (trajectories without an environment), a run's tools
    section is taken (with its turn length), 'none' drops them, and the trajectory flags are allowed with tools."""
    cfg = _cfg("--data", "gsm8k", "--tools", "calculator, python", "--max-turns", "3", "--max-new-tokens", "64",
               "--max-trajectory-tokens", "300")  # fmt: skip
    assert (cfg.tools.names, cfg.multi_turn, cfg.environment.enabled) == (("calculator", "python"), True, False)
    assert (cfg.environment.max_turns, cfg.environment.max_tokens) == (3, 300)
    cfg.check()
    assert not _cfg("--data", "gsm8k").multi_turn
    with pytest.raises(ValueError, match="environment.max_tokens"):  # 512 new tokens > the 300-token trajectory
        _cfg("--data", "gsm8k", "--tools", "calculator", "--max-trajectory-tokens", "300").check()

    run, _ = _run_folder(tmp_path, "tools=[calculator]")
    cfg = _cfg("--data", "gsm8k", model=str(run))
    assert (cfg.tools.names, cfg.rollout.max_new_tokens) == (("calculator",), 8)  # tiny_test.yaml's turn length
    assert _cfg("--data", "gsm8k", "--tools", "none", model=str(run)).tools.names == ()


def test_sample_stats_count_the_trajectorys_own_tool_calls():
    """tool_calls_mean / tool_use_frac count the tool messages after the opening: a few-shot opening's own tool
    message is not a call (by hand: trajectories with 0 + 2 + 1 calls of their own -> mean 1.0, use 2/3)."""
    from rlvr.evaluate import sample_stats
    from rlvr.types import Completion, VerifyResult

    shot = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "<tool_call>..."},
            {"role": "tool", "content": "2"}, {"role": "assistant", "content": "2"}, {"role": "user", "content": "q"}]
    a, t = {"role": "assistant", "content": "x"}, {"role": "tool", "content": "r"}
    convs = [shot + [a], shot + [a, t, t, a], shot + [a, t, a]]
    comps = [Completion(prompt_index=0, sample_index=i, prompt_ids=[1], token_ids=[2], logprobs=[0.0], text="x",
                        finish_reason="stop", policy_version=0, turns=1 + (i > 0), messages=m, end_reason="done",
                        opening_messages=len(shot)) for i, m in enumerate(convs)]  # fmt: skip
    scored = [type("S", (), {"results": {"v": VerifyResult(score=s, reason="r")}})() for s in (1.0, 0.0, 1.0)]
    st = sample_stats(comps, scored, "v")
    assert (st["tool_calls_mean"], st["tool_use_frac"]) == (1.0, pytest.approx(2 / 3))
    assert (st["turns_mean"], st["solved_turn_1_frac"], st["solved_after_turn_1_frac"]) == (
        pytest.approx(5 / 3), pytest.approx(1 / 3), pytest.approx(1 / 3))


def test_eval_of_a_reasoning_gym_run_takes_its_task_settings(tmp_path, caplog):
    """A run trained on a reasoning_gym source: rlvr eval RUN --data reasoning_gym:<task> --seed 7 evaluates the same
    task settings (its args, size, holdout) with seed 7's rows, the held-out seeds of issue 42."""
    run, _ = _run_folder(tmp_path, "data.source=reasoning_gym:basic_arithmetic", "data.reasoning_gym.size=50",
                         "data.reasoning_gym.args={min_terms: 2, max_terms: 2}")  # fmt: skip
    with caplog.at_level("INFO", logger="rlvr.eval"):
        cfg = _cfg("--data", "reasoning_gym:basic_arithmetic", "--seed", "7", model=str(run))
    rg = cfg.prompts.reasoning_gym
    assert (rg.args, rg.size, rg.holdout, cfg.seed) == ({"min_terms": 2, "max_terms": 2}, 50, 0, 7)
    assert "data.reasoning_gym={'args': {'min_terms': 2, 'max_terms': 2}, 'size': 50, 'holdout': 0}" in caplog.text
