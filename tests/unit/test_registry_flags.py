"""Recipe checks ask the registry entries what they need (capability flags), not their names: a newly
registered group estimator gets the G >= 2 check and the 0/1-reward check without touching rlvr/config.py."""

from __future__ import annotations

import pytest

from rlvr.algos import ADVANTAGES
from rlvr.config import RecipeError
from rlvr.recipe import load_recipe
from rlvr.registry import Registry


@pytest.fixture
def my_estimator():
    ADVANTAGES.register("my_group_norm", needs_groups=True, binary_rewards=True)(lambda rewards, cfg: rewards)
    yield "my_group_norm"
    for table in (ADVANTAGES._items, ADVANTAGES._flags, ADVANTAGES._settings):
        table.pop("my_group_norm")


def test_a_new_group_estimator_is_checked_by_its_flags(my_estimator):
    assert load_recipe(None, [f"algorithm.advantage={my_estimator}"]).algorithm.advantage.name == my_estimator
    with pytest.raises(RecipeError, match="compares samples within a group"):
        load_recipe(None, [f"algorithm.advantage={my_estimator}", "rollout.samples_per_prompt=1"])
    with pytest.raises(RecipeError, match="binary"):
        load_recipe(None, [f"algorithm.advantage={my_estimator}", "algorithm.overlong_buffer=4"])


def test_flags_default_to_false():
    reg: Registry = Registry("thing", flags=("needs_groups",))
    reg.register("a", needs_groups=True)(object())
    reg.add("b", object())
    assert reg.flag("a", "needs_groups") and not reg.flag("b", "needs_groups") and not reg.flag("zzz", "needs_groups")


def test_the_shipped_flags():
    from rlvr.algos import CRITIC_ADVANTAGES, POLICY_LOSSES

    assert [n for n in ADVANTAGES.names() if ADVANTAGES.flag(n, "needs_groups")] == [
        "dr_grpo", "grpo", "passk", "pkpo", "reinforce_pp", "rloo"]  # fmt: skip
    assert [n for n in ADVANTAGES.names() if ADVANTAGES.flag(n, "binary_rewards")] == ["passk", "pkpo"]
    assert CRITIC_ADVANTAGES.flag("gae", "token_advantages") and POLICY_LOSSES.flag("gspo", "sequence_advantages")
