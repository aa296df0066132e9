"""Each registry entry owns its settings (issue 11): a recipe gives them as ``{name: ..., field: value}``, dotted
overrides reach inside, the loader builds the entry's own frozen dataclass (unknown field -> nearest name), the
entry's own ``errors`` join the recipe's, and an old flat key names its new place. A new estimator is one
module (here: one registration) plus one recipe, with no change to rlvr/config.py or rlvr/recipe.py."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from rlvr.algos import ADVANTAGES, POLICY_LOSSES
from rlvr.algos.advantages import PassKSettings, PKPOSettings
from rlvr.algos.losses import PPOClipSettings
from rlvr.config import AlgorithmConfig, RecipeError, Spec, dump_yaml
from rlvr.recipe import load_recipe


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShiftSettings:
    shift: float = 0.5
    mode: Literal["add", "sub"] = "add"

    def errors(self, recipe, where):
        return [] if self.shift >= 0 else [f"{where}.shift={self.shift} must be >= 0"]


@pytest.fixture
def shift_estimator():
    ADVANTAGES.register("shift", settings=ShiftSettings, needs_groups=True)(
        lambda rewards, cfg: rewards + (cfg.shift if cfg.mode == "add" else -cfg.shift))
    yield "shift"
    for table in (ADVANTAGES._items, ADVANTAGES._flags, ADVANTAGES._settings):
        table.pop("shift")


def test_mapping_string_and_dotted_overrides(tmp_path):
    y = tmp_path / "r.yaml"
    y.write_text("algorithm:\n  advantage: {name: passk, k: 2}\n  policy_loss:\n    name: ppo_clip\n    clip_high: 0.28\n")
    al = load_recipe(y).algorithm
    assert al.advantage == Spec("passk", PassKSettings(k=2))
    assert al.policy_loss == Spec("ppo_clip", PPOClipSettings(clip_low=0.2, clip_high=0.28))
    assert load_recipe(y, ["algorithm.advantage.k=8"]).algorithm.advantage.settings.k == 8
    # a name replaces the whole entry (its settings back to defaults), then a dotted key reaches inside
    al = load_recipe(y, ["algorithm.advantage=pkpo", "algorithm.advantage.baseline=loo"]).algorithm
    assert al.advantage == Spec("pkpo", PKPOSettings(k=4, baseline="loo"))
    # a dotted key on the default entry (no advantage in the recipe): grpo's own setting
    assert load_recipe(None, ["algorithm.advantage.std_normalize=false"]).algorithm.advantage.settings.std_normalize is False


def test_a_dump_loads_back_to_the_same_recipe(tmp_path):
    r = load_recipe(None, ["algorithm.advantage=pkpo", "algorithm.advantage.k=3", "algorithm.policy_loss=gspo"])
    (tmp_path / "d.yaml").write_text(dump_yaml(r))
    assert load_recipe(tmp_path / "d.yaml") == r
    assert "  advantage:\n    name: pkpo\n    k: 3\n    baseline: loo_minus_one\n" in dump_yaml(r)


@pytest.mark.parametrize("overrides,match", [
    (["algorithm.advantage=passk", "algorithm.advantage.kk=2"], r"unknown key 'algorithm\.advantage\.kk': did you mean 'algorithm\.advantage\.k'"),
    (["algorithm.advantage=passk", "algorithm.advantage.k=two"], r"'algorithm\.advantage\.k' must be an integer"),
    (["algorithm.advantage=rloo", "algorithm.advantage.k=2"], r"algorithm\.advantage=rloo takes no settings, got \['k'\]"),
    (["algorithm.advantage=passk", "algorithm.advantage.k=9"], r"algorithm\.advantage\.k=9 must be in \[1, rollout\.samples_per_prompt=8\]: set algorithm\.advantage\.k=8"),
    (["algorithm.policy_loss.dual_clip_c=0.5"], r"algorithm\.policy_loss\.dual_clip_c=0\.5 must be 0 \(off\) or > 1"),
    (["algorithm.policy_loss=gspo", "algorithm.policy_loss.clip_low=-1"], r"algorithm\.policy_loss\.clip_low and algorithm\.policy_loss\.clip_high must be >= 0"),
    (["algorithm.advantage=gae", "algorithm.advantage.lam=2"], r"algorithm\.advantage\.gamma \(1\.0\) and algorithm\.advantage\.lam \(2\.0\) must be in \[0, 1\]"),
    (["algorithm.advantage.k.x=1"], r"write algorithm\.advantage=NAME or algorithm\.advantage\.SETTING=VALUE"),
])  # fmt: skip
def test_bad_settings_name_the_key_and_the_fix(overrides, match):
    with pytest.raises(RecipeError, match=match):
        load_recipe(None, overrides)


@pytest.mark.parametrize("old,new", [
    ("algorithm.passk_k=4", "algorithm.advantage.k"),
    ("algorithm.clip_high=0.28", "algorithm.policy_loss.clip_high"),
    ("algorithm.gspo_clip_low=3e-4", "policy_loss: {name: gspo, clip_low: 3.0e-4}"),
    ("algorithm.gamma=1.0", "algorithm.advantage.gamma"),
    ("algorithm.value_clip=0.2", "critic.value_clip"),
    ("algorithm.std_normalize=false", "algorithm.advantage.std_normalize"),
])  # fmt: skip
def test_an_old_flat_key_names_its_new_place(old, new):
    with pytest.raises(RecipeError, match="each method owns its settings now") as ei:
        load_recipe(None, [old])
    assert new in str(ei.value)


def test_a_new_estimator_is_one_registration(shift_estimator, tmp_path):
    y = tmp_path / "shift.yaml"
    y.write_text("algorithm:\n  advantage: {name: shift, shift: 0.25, mode: sub}\n")
    spec = load_recipe(y).algorithm.advantage
    assert spec == Spec("shift", ShiftSettings(shift=0.25, mode="sub"))
    assert ADVANTAGES.get("shift")(1.0, ADVANTAGES.settings_of(spec)) == 0.75
    with pytest.raises(RecipeError, match=r"algorithm\.advantage\.shift=-1\.0 must be >= 0"):
        load_recipe(y, ["algorithm.advantage.shift=-1"])
    with pytest.raises(RecipeError, match=r"'algorithm\.advantage\.mode' must be one of \['add', 'sub'\]"):
        load_recipe(y, ["algorithm.advantage.mode=mul"])
    with pytest.raises(RecipeError, match="compares samples within a group"):  # its flag, not its name
        load_recipe(y, ["rollout.samples_per_prompt=1"])


def test_settings_of():
    assert ADVANTAGES.settings_of(Spec("passk")) == PassKSettings(k=4)  # None: every field at its default
    assert POLICY_LOSSES.settings_of(AlgorithmConfig(policy_loss="ppo_clip").policy_loss) == PPOClipSettings()
    with pytest.raises(TypeError, match="unresolved"):
        ADVANTAGES.settings_of(Spec("passk", {"k": 2}))
    with pytest.raises(ValueError, match="frozen dataclass"):
        ADVANTAGES.register("bad", settings=dict)


def test_every_setting_of_every_entry_has_a_default_and_a_docstring():
    import ast
    import inspect

    for reg in (ADVANTAGES, POLICY_LOSSES):
        for name in reg:
            cls = reg.settings(name)
            for f in dataclasses.fields(cls):
                assert f.default is not dataclasses.MISSING, f"{name}.{f.name} has no default"
            if dataclasses.fields(cls):
                body = ast.parse(inspect.getsource(cls)).body[0].body
                documented = {body[i].target.id for i in range(len(body) - 1)
                              if isinstance(body[i], ast.AnnAssign) and isinstance(body[i + 1], ast.Expr)}  # fmt: skip
                assert documented == {f.name for f in dataclasses.fields(cls)}, f"{name}: document each setting"


def test_the_readme_estimator_works_as_shown(tmp_path):
    """README's "Add an advantage estimator": its module and recipe, verbatim, register and load."""
    import importlib.util
    import re
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = re.search(r"# rlvr/algos/my_estimator.py\n(.*?)```", readme, re.S).group(1)
    yaml_part = re.search(r"# recipes/methods/scaled.yaml: the smoke recipe with\n(.*?)```", readme, re.S).group(1)
    (tmp_path / "my_estimator.py").write_text(code)
    (tmp_path / "scaled.yaml").write_text(yaml_part)
    spec = importlib.util.spec_from_file_location("rlvr.algos.my_estimator", tmp_path / "my_estimator.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would (dataclasses look their module up)
    try:
        spec.loader.exec_module(module)
        al = load_recipe(tmp_path / "scaled.yaml", ["algorithm.advantage.scale=0.5"]).algorithm
        assert al.advantage == Spec("scaled", module.ScaledSettings(scale=0.5))
        import torch

        adv = ADVANTAGES.get("scaled")(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), al.advantage.settings)
        assert adv.tolist() == [[0.25, -0.25, -0.25, 0.25]]  # 0.5 * (r - 0.5)
        with pytest.raises(RecipeError, match=r"algorithm\.advantage\.scale=-1\.0 must be > 0"):
            load_recipe(tmp_path / "scaled.yaml", ["algorithm.advantage.scale=-1"])
    finally:
        sys.modules.pop(spec.name)
        for table in (ADVANTAGES._items, ADVANTAGES._flags, ADVANTAGES._settings):
            table.pop("scaled", None)


def test_a_plugin_module_from_an_entry_point_registers(monkeypatch, tmp_path):
    """A third-party package's module named in the ``rlvr.algos`` entry-point group is imported with the registries."""
    import importlib
    import importlib.metadata
    import sys

    import rlvr.algos

    (tmp_path / "my_plugin_est.py").write_text(
        "from rlvr.algos.advantages import ADVANTAGES\n"
        "ADVANTAGES.register('plugin_est', needs_groups=True)(lambda rewards, cfg: rewards)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint(name="mine", value="my_plugin_est", group=rlvr.algos.ENTRY_POINT_GROUP)
    bad = importlib.metadata.EntryPoint(name="broken", value="no_such_module_xyz", group=rlvr.algos.ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [ep] if group == "rlvr.algos" else [])
    try:
        rlvr.algos._import_all()
        assert load_recipe(None, ["algorithm.advantage=plugin_est"]).algorithm.advantage.name == "plugin_est"
        monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [bad])
        with pytest.raises(ImportError, match="rlvr.algos plugin 'broken' \\(no_such_module_xyz\\) failed to import"):
            rlvr.algos._import_all()
    finally:
        sys.modules.pop("my_plugin_est", None)
        for table in (ADVANTAGES._items, ADVANTAGES._flags, ADVANTAGES._settings):
            table.pop("plugin_est", None)


def test_override_order_does_not_matter():
    a = load_recipe(None, ["algorithm.advantage.k=2", "algorithm.advantage=passk"]).algorithm.advantage
    b = load_recipe(None, ["algorithm.advantage=passk", "algorithm.advantage.k=2"]).algorithm.advantage
    assert a == b == Spec("passk", PassKSettings(k=2))


def test_a_key_given_twice_is_refused(tmp_path):
    y = tmp_path / "twice.yaml"
    y.write_text("run:\n  steps: 3\nalgorithm:\n  advantage: grpo\nrun:\n  steps: 7\n")
    with pytest.raises(RecipeError, match=r"key 'run' is given twice in one mapping \(lines 1 and 5\)"):
        load_recipe(y)
    y.write_text("algorithm:\n  advantage: {name: passk, name: pkpo}\n")
    with pytest.raises(RecipeError, match="key 'name' is given twice"):
        load_recipe(y)


def test_a_setting_without_default_is_required_and_a_misspelled_flag_refused():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Req:
        scale: float
        """No default."""

    ADVANTAGES.register("req", settings=Req)(lambda rewards, cfg: rewards)
    try:
        with pytest.raises(RecipeError, match=r"'algorithm\.advantage\.scale' is required"):
            load_recipe(None, ["algorithm.advantage=req"])
        assert load_recipe(None, ["algorithm.advantage=req", "algorithm.advantage.scale=2"]).algorithm.advantage.settings == Req(scale=2.0)
    finally:
        for table in (ADVANTAGES._items, ADVANTAGES._flags, ADVANTAGES._settings):
            table.pop("req", None)
    with pytest.raises(ValueError, match="unknown flag 'needs_group' \\(did you mean 'needs_groups'\\?\\)"):
        ADVANTAGES.register("typo", needs_group=True)
    with pytest.raises(RecipeError, match=r"'algorithm\.advantage\.name' must be a registered name \(a string\), got 1"):
        load_recipe(None, ["algorithm.advantage={name: 1}"])
