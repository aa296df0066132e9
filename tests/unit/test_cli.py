"""``rlvr train RECIPE [overrides] --dry-run`` and ``rlvr model NAME``, called in-process through rlvr.cli.main."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlvr.cli import main
from rlvr.recipe import load_recipe

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml"


def _without_memory(lines: list[str]) -> list[str]:
    """``lines`` less the memory model's block (from ``memory model`` to ``memory needed:``, rlvr/runtime/memory.py)."""
    start = next(i for i, ln in enumerate(lines) if ln.startswith("memory model"))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("memory needed:"))
    return lines[:start] + lines[end + 1 :]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # tiny_test's output_dir is the relative "runs"


def test_dry_run_prints_resolved_recipe_and_derived(tmp_path, capsys):
    assert main(["train", str(TINY), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    head, derived = out.split("# derived\n")
    assert head.startswith("# resolved recipe\n")
    assert list(tmp_path.iterdir()) == []  # no run folder
    # the printed YAML is the resolved recipe, every default filled in
    printed = head.removeprefix("# resolved recipe\n")
    assert yaml.safe_load(printed)["trainer"]["zero_stage"] == 2
    (tmp_path / "printed.yaml").write_text(printed)
    assert load_recipe(tmp_path / "printed.yaml") == load_recipe(TINY)
    # B = 4 x 4 = 16; 16 x (64 + 8) = 1152 tokens; 16 / 8 = 2 micro-batches; 16 x 3 steps = 48
    assert _without_memory(derived.splitlines()) == [
        "#   prompts_per_step: 4",
        "#   samples_per_step: 16",
        "#   max_tokens_per_step: 1152",
        "#   mini_batch_size: 16",
        "#   optimizer_steps_per_rollout_batch: 1",
        "#   grad_accum_steps_per_rank: 2",
        "#   pass_k: [1, 2, 4]",
        "#   total_samples: 48",
        "checked: verifier args reward.verifiers[0] fit their constructors",
        "checked: model tiny-random context 512 >= 64 + 8 (data.max_prompt_tokens + rollout.max_new_tokens)",
        "checked: data generated: 200 rows, golds usable 200/200 (verifier numeric), 200 prompts (0 over 64 tokens)",
        "checked: verifiers numeric built",
        "dry run: recipe valid; model context, data and verifiers checked: the run will start; nothing started.",
    ]


def test_dry_run_prints_the_memory_model(capsys):
    """Issue 27: --dry-run ends with the memory model's table (trainer and engine rows on the host's memory for a
    CPU recipe; a GPU recipe gets the card it needs)."""
    assert main(["train", str(TINY), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("memory model"))
    assert lines[i + 1].split() == ["role", "device", "weights", "grads", "optimizer", "reference", "activations",
                                    "logits", "other", "total"]
    assert [ln.split()[:2] for ln in lines[i + 2 : i + 4]] == [["trainer", "cpu"], ["engine", "cpu"]]
    assert lines[-2].startswith("memory needed: ") and " GiB of host memory (" in lines[-2]
    assert main(["train", str(TINY), "trainer.num_gpus=0.5", "rollout.num_gpus=0.4", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[:2] for ln in lines if ln.startswith(("trainer ", "engine "))] == [["trainer", "gpu0"],
                                                                                          ["engine", "gpu0"]]
    assert lines[-2].startswith("memory needed: a GPU card of ")


def test_dry_run_loads_the_data_and_builds_the_verifiers(tmp_path, capsys):
    """Issue 24, --dry-run: it loads the data as the run does (rows, golds, prompt lengths against the tiny-random
    tokenizer) and builds every verifier, saying what it checked; every data and verifier error the run would
    meet fails it (exit 2, one line naming the key), before anything starts. Five rows: row 1's answer is null
    (dropped under data.bad_gold=drop), row 2's prompt is 53 tokens, over data.max_prompt_tokens=40 (the others
    are 23)."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": null, "id": "q-7"}\n'
                    '{"question": "What is 12 plus 30? Think it over.", "answer": "42"}\n'
                    '{"question": "3+4?", "answer": "7"}\n{"question": "3+5?", "answer": "8"}\n')
    base = ["train", str(TINY), f"data.source={data}", "data.max_prompt_tokens=40", "rollout.prompts_per_step=2"]
    assert main([*base, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert _without_memory(out.splitlines())[-3:] == [
        f"checked: data {data}: 5 rows, golds usable 4/5 (verifier numeric), 3 prompts (1 over 40 tokens)",
        "checked: verifiers numeric built",
        "dry run: recipe valid; model context, data and verifiers checked: the run will start; nothing started.",
    ]
    for override, expected in (
        ("data.bad_gold=error", "1 of 5 rows have no gold verifier 'numeric' can use: row 1 (id 'q-7'): no gold "
                                "(field 'answer' is null (data.answer)). data.bad_gold=error"),
        ("rollout.prompts_per_step=4", "data: 3 usable prompts but rollout.prompts_per_step=4 (5 rows; 1 without a "
                                       "usable gold, 1 longer than data.max_prompt_tokens=40): lower "
                                       "rollout.prompts_per_step, or raise data.max_prompt_tokens (at most 504: the "
                                       "model's 512-token context less rollout.max_new_tokens=8), or fix the unusable "
                                       "golds"),
        ("reward.verifiers=[{name: numeric}, {name: format}]",
         "reward.verifiers[1] (format) cannot be built with args {}: ValueError: the format verifier needs at least "
         "one of think, boxed, answer_tag set to true; fix reward.verifiers[1].args"),
    ):
        assert main([*base, override, "--dry-run"]) == 2, override
        out, err = capsys.readouterr()
        assert expected in err and "dry run:" not in out, (override, err)
    assert list(tmp_path.iterdir()) == [data]  # no run folder


def test_dry_run_applies_overrides(tmp_path, capsys):
    assert main(["train", str(TINY), "run.steps=5", "rollout.samples_per_prompt=6", "--dry-run"]) == 0
    out = capsys.readouterr().out
    # B = 4 x 6 = 24; 24 x 5 = 120; pass_k for G=6 is 1, 2, 4 and G
    assert "#   samples_per_step: 24\n" in out
    assert "#   total_samples: 120\n" in out
    assert "#   pass_k: [1, 2, 4, 6]\n" in out
    assert list(tmp_path.iterdir()) == []


def test_bad_override_returns_2_with_message_on_stderr(capsys):
    assert main(["train", str(TINY), "trainer.lrr=1e-6", "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "rlvr train: unknown key 'trainer.lrr': did you mean 'trainer.lr'?\n"


def test_override_without_equals_returns_2(capsys):
    assert main(["train", str(TINY), "run.steps", "--dry-run"]) == 2
    assert "must look like section.key=value" in capsys.readouterr().err


def test_invalid_recipe_returns_2(capsys):
    assert main(["train", str(TINY), "rollout.num_engines=3", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlvr train: invalid recipe:")
    assert "rollout.prompts_per_step (4) must divide evenly over rollout.num_engines (3)" in err


def test_missing_recipe_file_returns_2_with_clear_message(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert main(["train", str(missing), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"rlvr train: cannot read recipe file '{missing}': No such file or directory\n"


def test_recipe_that_is_a_folder_returns_2(tmp_path, capsys):
    assert main(["train", str(tmp_path), "--dry-run"]) == 2
    assert capsys.readouterr().err == f"rlvr train: cannot read recipe file '{tmp_path}': Is a directory\n"


def test_malformed_yaml_returns_2_naming_the_file(tmp_path, capsys):
    p = tmp_path / "listy.yaml"
    p.write_text("- run\n")
    assert main(["train", str(p), "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith(f"rlvr train: {p}: a recipe must be a YAML mapping")


def test_model_prints_a_local_folder_and_passes_hub_ids_through(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert main(["model", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{tmp_path}\n"
    assert main(["model", "Qwen/Qwen2.5-0.5B-Instruct"]) == 0
    assert capsys.readouterr().out == "Qwen/Qwen2.5-0.5B-Instruct\n"


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["train"])  # no recipe: argparse's usage error
    assert ei.value.code == 2
    assert "recipe" in capsys.readouterr().err


def test_preflight_catches_typos_before_anything_starts(tmp_path, capsys):
    """A verifier typo, a missing data file and an unknown model name fail in --dry-run, exit 2, no run folder."""
    from rlvr.cli import main

    for override, expected in (
        ("reward.verifiers=[{name: numerc}]", "Did you mean 'numeric'?"),
        ("data.source=data/nope.jsonl", "data.source='data/nope.jsonl': no such file"),
        ("data.source=data/gsm8k/trian.jsonl", "fix the path. Did you mean 'data/gsm8k/train.jsonl'?"),
        ("model.path=smollm2-135m", "Did you mean 'smollm2-135m-instruct'?"),
    ):
        recipe = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")
        rc = main(["train", recipe, f"run.output_dir={tmp_path}", override, "--dry-run"])
        err = capsys.readouterr().err
        assert rc == 2 and expected in err, (override, err)
    assert not any(tmp_path.iterdir())


def test_run_and_checkpoint_folders_resolve_to_their_policy(tmp_path):
    """`rlvr eval runs/<name>` means the run's final policy (or its newest checkpoint's); an empty folder is an
    error that says what it lacks."""
    from rlvr.models import resolve_model

    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002" / "trainer" / "hf").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "trainer" / "hf" / "config.json").write_text("{}")
    (run / "checkpoints" / "step_000002" / "COMPLETE").write_text("")
    (run / "checkpoints" / "step_000004.tmp-1-abcdef01" / "trainer" / "hf").mkdir(parents=True)  # not complete
    assert resolve_model(str(run)) == str(run / "checkpoints" / "step_000002" / "trainer" / "hf")
    assert resolve_model(str(run / "checkpoints" / "step_000002")) == str(run / "checkpoints" / "step_000002" / "trainer" / "hf")
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")
    assert resolve_model(str(run)) == str(run / "final")
    assert resolve_model(str(run / "final")) == str(run / "final")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds no model"):
        resolve_model(str(empty))


@pytest.mark.parametrize("argv", [["--help"], ["eval", "--help"], ["train", "--help"], ["verify", "--help"]])
def test_help_prints_usage(argv, capsys):
    """argparse formats help strings with %: a bare '95%' once crashed `rlvr --help` (TypeError)."""
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 0 and "usage: rlvr" in capsys.readouterr().out


def test_non_default_keys_are_exactly_the_overrides():
    from rlvr.recipe import non_default_keys

    # no recipe file: every key at its default (model.dtype auto resolves alike on both sides), then two overrides
    assert non_default_keys(load_recipe(None, ["run.steps=5", "trainer.lr=0.001"])) == {"run.steps": 5, "trainer.lr": 0.001}
    assert non_default_keys(load_recipe(None, [])) == {}
    # a setting inside a named entry is its dotted key; an entry under another name is one key with its settings
    # (passk's k defaults to 4); a free mapping's new key is dotted; a list is one key
    assert non_default_keys(load_recipe(None, [
        "algorithm.policy_loss.clip_high=0.28", "algorithm.advantage=passk", "trainer.resources={gen: 1}",
        "reward.verifiers=[{name: numeric}]",
    ])) == {
        "reward.verifiers": [{"name": "numeric", "weight": 1.0, "args": {}, "key": None}],
        "algorithm.advantage": {"name": "passk", "k": 4},
        "algorithm.policy_loss.clip_high": 0.28,
        "trainer.resources.gen": 1,
    }  # fmt: skip


def test_a_run_prints_the_non_default_keys_and_the_derived_sizes(capsys):
    from rlvr.cli import _print_recipe

    _print_recipe(load_recipe(None, ["run.steps=5", "data.prompt_template='{question} Answer:'",
                                     "algorithm.advantage=passk"]), whole=False)  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert out[:5] == [
        "# recipe: the keys that differ from the defaults (the whole resolved recipe: recipe.yaml in the run folder; "
        "--dry-run prints it)",
        "run.steps: 5",
        "data.prompt_template: '{question} Answer:'",
        "algorithm.advantage: {name: passk, k: 4}",
        "# derived",
    ]
    # the defaults: 8 prompts x 8 samples = 64 per step, 5 steps
    assert "#   samples_per_step: 64" in out and out[-1] == "#   total_samples: 320"
