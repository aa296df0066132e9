"""Load-time checks of issue 24 (rlvr.runtime.checks, rlvr.registry.check_kwargs): a prompt and its response
against the model's context, and verifier args against their constructors, refused at preflight (before Ray, a run
folder or an engine) with the recipe keys to change and the values that fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.config import RecipeError
from rlvr.recipe import load_recipe

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml"  # tiny-random: 512 positions


def _recipe(*overrides: str):
    return load_recipe(TINY, list(overrides))


def test_prompt_and_response_longer_than_the_context_fail_at_preflight():
    """Issue 24 item 1: 400 + 200 tokens on tiny-random's 512 positions passed --dry-run, and the run died in
    the engine ~60 s later (vLLM's max_model_len error). Now preflight names both keys and the largest values
    that fit: 512 - 200 = 312 prompt tokens, or 512 - 400 = 112 new tokens."""
    from rlvr.runtime.controller import preflight

    with pytest.raises(RecipeError) as e:
        preflight(_recipe("data.max_prompt_tokens=400", "rollout.max_new_tokens=200"))
    assert str(e.value) == (
        "data.max_prompt_tokens + rollout.max_new_tokens = 400 + 200 = 600 tokens, more than the 512-token context "
        "of model tiny-random (max_position_embeddings of its config.json), which a prompt and its response share "
        "(the engine refuses a longer one): lower data.max_prompt_tokens to at most 312 (keeping "
        "rollout.max_new_tokens=200), or rollout.max_new_tokens to at most 112 (keeping data.max_prompt_tokens=400)"
    )
    assert preflight(_recipe("data.max_prompt_tokens=504"))[-1] == (
        "checked: model tiny-random context 512 >= 504 + 8 (data.max_prompt_tokens + rollout.max_new_tokens)"
    )  # 504 + 8 = 512: exactly full fits


def test_context_fixes_by_hand():
    """Each key alone where the other leaves it a token; both (as rlvr eval fits them: half the context for the
    prompt) where neither alone can; a config without max_position_embeddings is said to be unchecked."""
    from rlvr.runtime.checks import check_context

    def fixes(p: int, n: int, ctx: int) -> str:
        with pytest.raises(RecipeError) as e:
            check_context(_recipe(f"data.max_prompt_tokens={p}", f"rollout.max_new_tokens={n}"), ctx)
        return str(e.value).split(": lower ")[1]

    assert fixes(100, 600, 512) == "rollout.max_new_tokens to at most 412 (keeping data.max_prompt_tokens=100)"
    assert fixes(600, 100, 512) == "data.max_prompt_tokens to at most 412 (keeping rollout.max_new_tokens=100)"
    assert fixes(600, 600, 512) == "both, e.g. data.max_prompt_tokens=256 rollout.max_new_tokens=256"
    assert fixes(512, 1, 512) == "data.max_prompt_tokens to at most 511 (keeping rollout.max_new_tokens=1)"
    assert check_context(_recipe(), None) == ("not checked: data.max_prompt_tokens + rollout.max_new_tokens = 64 + 8: "
                                              "model tiny-random declares no max_position_embeddings")


def test_unknown_verifier_args_fail_at_preflight_with_the_nearest_name(tmp_path):
    """Issue 24 item 3: `numeric` with `tolerence` passed --dry-run and the run died with a raw TypeError. Now
    preflight names the recipe key, the nearest argument and what the constructor takes; args given to a function
    verifier (it takes none) are refused there too."""
    from rlvr.runtime.controller import preflight

    with pytest.raises(RecipeError) as e:
        preflight(_recipe("reward.verifiers=[{name: math}, {name: numeric, args: {tolerence: 0.01}}]"))
    assert str(e.value) == ("unknown key 'reward.verifiers[1].args.tolerence': did you mean "
                            "'reward.verifiers[1].args.tolerance'? (NumericVerifier takes tolerance, units)")
    plugin = tmp_path / "fn.py"
    plugin.write_text("def exact(response, gold, **row):\n    return response == gold\n")
    with pytest.raises(RecipeError) as e:
        preflight(_recipe(f"reward.verifiers=[{{name: '{plugin}:exact', args: {{strict: true}}}}]"))
    assert str(e.value) == (f"'reward.verifiers[0].args': verifier '{plugin}:exact' is a function, not a class, so it "
                            "takes no args (got strict); drop 'reward.verifiers[0].args', or make it a class whose "
                            "constructor takes them")
    assert preflight(_recipe("reward.verifiers=[{name: numeric, args: {tolerance: 0.01}}]"))[0] == (
        "checked: verifier args reward.verifiers[0] fit their constructors")


def test_check_kwargs_by_hand():
    """The one check environments and tools will reuse: unknown names with the nearest, required ones left out,
    ``**kwargs`` taking anything."""
    from rlvr.registry import check_kwargs

    class Env:
        def __init__(self, max_turns: int, *, reward_scale: float = 1.0) -> None: ...

    def tool(query, top_k=3): ...

    def anything(**kw): ...

    check_kwargs(Env, {"max_turns": 3, "reward_scale": 2.0}, "env.args")
    check_kwargs(anything, {"whatever": 1}, "x")
    with pytest.raises(RecipeError, match=r"^unknown key 'env\.args\.reward_scal': did you mean "
                                          r"'env\.args\.reward_scale'\? \(Env takes max_turns, reward_scale\)$"):
        check_kwargs(Env, {"max_turns": 3, "reward_scal": 2.0}, "env.args")
    with pytest.raises(RecipeError, match=r"^'env\.args' lacks max_turns: Env needs it \(no default\); add "
                                          r"env\.args\.max_turns$"):
        check_kwargs(Env, {}, "env.args")
    with pytest.raises(RecipeError, match=r"^unknown key 'tools\[0\]\.args\.k': tool takes query, top_k$"):
        check_kwargs(tool, {"query": "q", "k": 1}, "tools[0].args")


def test_a_validation_source_is_checked_only_when_validation_runs():
    """validation.every_steps 0 is no validation: its source is never read, so a missing file there does not stop
    the run (it did); with validation on, it is refused with the key."""
    from rlvr.runtime.controller import preflight

    preflight(_recipe("validation.source=nope.jsonl"))
    with pytest.raises(FileNotFoundError, match=r"validation.source='nope.jsonl': no such file"):
        preflight(_recipe("validation.source=nope.jsonl", "validation.every_steps=2"))


def test_an_environments_own_check_refuses_a_bad_feedback_verifier_at_load():
    """A new user's `environment.args.verifier=mth` passed --dry-run (feedback builds its verifier in the worker,
    so every trajectory would have ended as an environment error); the environment's own check_args now refuses it
    at load with the nearest name, and checks the verifier's args as reward.verifiers' are."""
    from rlvr.runtime.controller import preflight

    env = ["environment.name=feedback", "environment.max_tokens=64"]
    preflight(_recipe(*env, "environment.args={verifier: numeric}"))
    with pytest.raises(RecipeError, match=r"environment.args \(feedback\): unknown verifier 'mth'. Did you mean 'math'"):
        preflight(_recipe(*env, "environment.args={verifier: mth}"))
    with pytest.raises(RecipeError, match=r"environment.args.args.*tolerence.*tolerance"):
        preflight(_recipe(*env, "environment.args={verifier: numeric, args: {tolerence: 0.1}}"))


def test_args_kept_from_the_recipe_for_another_environment_say_where_they_came_from():
    """A new user swapped environment.name on the multi-turn recipe and got "unknown key 'environment.args.verifier'"
    without being told the args came from the recipe; the message now says so and how to clear them."""
    from rlvr.runtime.controller import preflight

    env = ["environment.max_tokens=64", "environment.args={verifier: math}"]
    with pytest.raises(RecipeError, match=r"unknown key 'environment.args.verifier'.*environment.args=\{'verifier': "
                                          r"'math'\} come from the recipe.*for environment guess; "
                                          r"'environment.args=\{\}' clears them"):
        preflight(_recipe(*env, "environment.name=guess"))
    preflight(_recipe("environment.max_tokens=64", "environment.name=guess", "environment.args={}"))


# -- issue 38: recipe checks at load (items 4, 5, 11, 12) --------------------------------------------------------


def test_an_environment_reward_nothing_gives_is_refused_at_load():
    """Issue 38 item 4: a tools-only recipe with environment.reward=environment loaded, and every reward was 0 (a
    tool gives no reward; the rollout counts a missing environment reward as 0). Now refused, naming the keys and
    the fix; ``both`` (the verifiers' alone) and a single-turn recipe (the key ignored) too; with an environment
    named it loads."""
    tools = ["tools.names=[calculator]", "environment.max_tokens=64"]
    with pytest.raises(RecipeError) as e:
        _recipe(*tools, "environment.reward=environment")
    msg = str(e.value)
    for words in ("environment.reward=environment with tools (calculator) but no environment", "every reward would "
                  "be 0", "Set environment.reward=verifiers", "environment.name"):  # fmt: skip
        assert words in msg
    with pytest.raises(RecipeError, match=r"environment.reward=both with tools \(calculator\).*the verifiers' alone"):
        _recipe(*tools, "environment.reward=both")
    with pytest.raises(RecipeError, match=r"environment.reward=environment with no environment or tools.*ignored"):
        _recipe("environment.reward=environment")
    _recipe(*tools)  # the default (verifiers) loads
    _recipe(*tools, "environment.name=feedback", "environment.reward=environment")


def test_raw_text_prompts_with_chat_turns_are_refused_at_load():
    """Issue 38 item 11: data.chat_template=false with an environment or tools loaded, and a trajectory mixed a
    raw-text first prompt with chat-template turns. Now refused naming the keys; single-turn raw text loads."""
    for keys, named in ((["environment.name=feedback"], "environment.name=feedback"),
                        (["tools.names=[calculator]"], "tools.names=['calculator']")):  # fmt: skip
        with pytest.raises(RecipeError) as e:
            _recipe(*keys, "environment.max_tokens=64", "data.chat_template=false")
        msg = str(e.value)
        for words in (f"data.chat_template=false with {named}", "mix raw text and chat turns",
                      "Set data.chat_template=true"):  # fmt: skip
            assert words in msg
    _recipe("data.chat_template=false")


def test_distillation_at_another_temperature_than_the_teachers_is_refused_at_load():
    """Issue 38 item 5: on-policy distillation loaded with rollout.temperature=0.7, while the teacher scores at
    temperature 1 (vLLM's prompt logprobs ignore a temperature) and log p_S is the sampler's at 0.7: the advantage
    compared two temperatures. Now refused naming both keys and the fix; at 1.0 it loads."""
    distill = ["algorithm.advantage=distill", "teacher.model=tiny-random"]
    with pytest.raises(RecipeError) as e:
        _recipe(*distill, "rollout.temperature=0.7")
    msg = str(e.value)
    for words in ("algorithm.advantage=distill with rollout.temperature=0.7", "the teacher scores at temperature 1",
                  "Set rollout.temperature=1.0"):  # fmt: skip
        assert words in msg
    assert _recipe(*distill, "rollout.temperature=1.0").rollout.temperature == 1.0
    _recipe("rollout.temperature=0.7")  # without distillation a temperature is the user's choice


def test_roles_that_cannot_share_a_gpu_are_refused_at_load():
    """Issue 38 item 12: two engines at rollout.num_gpus=0.5 asking gpu_memory_utilization 0.5 each (1.0 of one
    card) crashed --dry-run with OverflowError in the memory model, and two trainer ranks at trainer.num_gpus=0.5
    (one GPU, an NCCL data-parallel group) loaded. Both are refused naming the keys and the fix; the fixes load.
    By hand: 2 x 0.5 = 1 >= 1; the suggested share int(90 / 2) / 100 = 0.45; a teacher at 0.5 of a GPU taking 0.6
    fits beside a rollout worker at 0.4 taking 0.4: 0.6 + 0.4 = 1."""
    gpu = ["trainer.num_gpus=1", "sync.backend=gloo"]
    two = ["rollout.num_engines=2", "rollout.num_gpus=0.5"]
    with pytest.raises(RecipeError) as e:
        _recipe(*gpu, *two, "rollout.gpu_memory_utilization=0.5")
    msg = str(e.value)
    for words in ("vLLM engines that fit on one GPU would take all of it or more", "2 x rollout.gpu_memory_utilization"
                  "=0.5 (rollout.num_gpus=0.5 each) = 1 of the card", "e.g. rollout.gpu_memory_utilization=0.45",
                  "give the engines GPUs of their own"):  # fmt: skip
        assert words in msg
    _recipe(*gpu, *two, "rollout.gpu_memory_utilization=0.45")
    _recipe(*gpu, "rollout.num_engines=2", "rollout.num_gpus=0.6", "rollout.gpu_memory_utilization=0.6")  # apart
    teacher = ["algorithm.advantage=distill", "teacher.model=tiny-random", "teacher.num_gpus=0.5", "rollout.num_gpus=0.4"]
    with pytest.raises(RecipeError, match=r"teacher.gpu_memory_utilization=0.6 \(teacher.num_gpus=0.5\) \+ "
                                          r"rollout.gpu_memory_utilization=0.4 \(rollout.num_gpus=0.4\) = 1 of the card"):
        _recipe(*gpu, *teacher, "teacher.gpu_memory_utilization=0.6", "rollout.gpu_memory_utilization=0.4")
    with pytest.raises(RecipeError) as e:
        _recipe("trainer.num_workers=2", "trainer.num_gpus=0.5", "rollout.num_gpus=1", "sync.backend=gloo")
    msg = str(e.value)
    for words in ("trainer.num_gpus=0.5 with trainer.num_workers=2", "2 trainer ranks would share one GPU",
                  "Duplicate GPU detected", "Set trainer.num_gpus: 1", "or trainer.num_workers: 1"):  # fmt: skip
        assert words in msg
    _recipe("trainer.num_workers=2", "trainer.num_gpus=1", "rollout.num_gpus=1", "sync.backend=gloo")
    _recipe("trainer.num_workers=2", "trainer.num_gpus=0.6", "rollout.num_gpus=0.4", "sync.backend=gloo")
    with pytest.raises(RecipeError, match=r"rollout.gpu_memory_utilization=1.5 must be in \(0, 1\]"):
        _recipe("rollout.gpu_memory_utilization=1.5")


def test_a_missing_environment_or_tool_file_is_named_so_and_typos_get_the_nearest_name(tmp_path):
    """Issue 38 item 14: a missing environment file was reported as a "verifier file", and a class or tool name
    misspelt in a module or file target got no nearest name. Now the file is named by what it holds, and a missing
    attribute names the nearest one the module has; an unknown built-in tool name names the nearest built-in."""
    from rlvr.runtime.controller import preflight

    envs = tmp_path / "my_envs.py"
    envs.write_text("from rlvr.envs.builtins import Feedback\n\nclass Countdown(Feedback):\n    pass\n")
    env = ["environment.max_tokens=64"]
    with pytest.raises(FileNotFoundError, match=r"^environment file '.*my_env\.py' not found .*Did you mean "
                                                r"'.*my_envs\.py'\?$"):
        preflight(_recipe(*env, f"environment.name={tmp_path}/my_env.py:Countdown"))
    with pytest.raises(AttributeError, match=r"has no attribute 'Countdwn'\. Did you mean .*my_envs\.py:Countdown\?$"):
        preflight(_recipe(*env, f"environment.name={envs}:Countdwn"))
    with pytest.raises(AttributeError, match=r"^environment 'rlvr\.envs\.builtins:Feedbak': rlvr\.envs\.builtins has "
                                             r"no attribute 'Feedbak'\. Did you mean rlvr\.envs\.builtins:Feedback\?$"):
        preflight(_recipe(*env, "environment.name=rlvr.envs.builtins:Feedbak"))
    tools = ["environment.max_tokens=64", "environment.reward=verifiers"]
    with pytest.raises(RecipeError, match=r"^tools\.names: tool file 'my_tools\.py' not found"):
        preflight(_recipe(*tools, "tools.names=[my_tools.py:mul]"))
    with pytest.raises(RecipeError, match=r"has no attribute 'calculater'\. Did you mean "
                                          r"rlvr/tools/builtins\.py:calculator\?$"):
        preflight(_recipe(*tools, "tools.names=[rlvr/tools/builtins.py:calculater]"))
    with pytest.raises(RecipeError, match=r"unknown tool 'calculater'\. Did you mean 'calculator'\?"):
        preflight(_recipe(*tools, "tools.names=[calculater]"))
    with pytest.raises(AttributeError, match=r"^verifier 'rlvr_verifiers\.math:MathVerifier\.verfy': "
                                             r"rlvr_verifiers\.math:MathVerifier has no attribute 'verfy'\. Did you mean "
                                             r"rlvr_verifiers\.math:MathVerifier\.verify\?$"):
        preflight(_recipe("reward.verifiers=[{name: 'rlvr_verifiers.math:MathVerifier.verfy'}]"))
