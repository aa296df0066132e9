"""Load-time checks of issue 24 (rlvr.registry.check_kwargs): verifier args against their constructors, refused at
preflight (before Ray, a run folder or an engine) with the recipe key to change and the nearest name."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.config import RecipeError
from rlvr.recipe import load_recipe

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml"


def _recipe(*overrides: str):
    return load_recipe(TINY, list(overrides))


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
    preflight(_recipe("reward.verifiers=[{name: numeric, args: {tolerance: 0.01}}]"))


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
