"""``trainer.lora``'s load-time checks (issue 28): the recipe's own refusals (rlvr.recipe.lora_errors) and the
targets and rank against the model's modules, built on the meta device at preflight (rlvr.train.lora.check_lora).
Each message names the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.config import RecipeError
from rlvr.recipe import load_recipe

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")
LORA = ["trainer.lora.rank=4", "trainer.lora.alpha=8"]


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.lora.rank=-1"], "trainer.lora.rank=-1 must be >= 0"),
    (["trainer.lora.rank=4", "trainer.lora.sync=adapter", "rollout.engine=hf"],
     "trainer.lora.sync=adapter with rollout.engine=hf: only the vLLM engine serves LoRA adapters; use "
     "trainer.lora.sync=merged"),
    (["trainer.lora.rank=513", "trainer.lora.sync=adapter"], "vLLM serves LoRA ranks up to 512"),
    (["trainer.lora.rank=4", "trainer.backend=deepspeed", "trainer.zero_stage=3"], "use trainer.zero_stage=2"),
    (["trainer.lora.rank=4", "trainer.lora.dropout=1"], r"trainer.lora.dropout=1.0 must be in \[0, 1\)"),
    (["trainer.lora.rank=4", "trainer.lora.alpha=0"], "trainer.lora.alpha=0.0 must be > 0"),
    (["trainer.lora.rank=4", "trainer.lora.target_modules=[]"], "trainer.lora.target_modules is empty"),
    (["trainer.lora.rank=4", "trainer.lora.target_modules=[all-linear, q_proj]"], "give it alone"),
])  # fmt: skip
def test_recipe_refusals_name_the_key_and_the_fix(overrides, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(TINY, overrides)
    load_recipe(TINY, ["trainer.lora.rank=0", "trainer.lora.sync=adapter", "rollout.engine=hf"])  # off: not read
    load_recipe(TINY, ["trainer.lora.rank=512", "trainer.lora.sync=adapter"])  # vLLM's largest: accepted


def test_preflight_checks_targets_and_rank_against_the_model():
    """tiny-random: q/k/v/o_proj are [128, 128], gate/up_proj [256, 128], down_proj [128, 256] (2 layers: 14
    Linears besides lm_head); a rank of 129 is over q_proj's 128."""
    from rlvr.runtime.checks import preflight

    assert preflight(load_recipe(TINY, LORA))[-1] == (
        "checked: trainer.lora rank 4 on 14 Linear modules of model tiny-random (smallest dimension 128)")
    assert preflight(load_recipe(TINY, [*LORA, "trainer.lora.target_modules=[all-linear]"]))[-1].startswith(
        "checked: trainer.lora rank 4 on 14 Linear")  # lm_head (the output layer) left out
    with pytest.raises(RecipeError) as e:
        preflight(load_recipe(TINY, ["trainer.lora.rank=4", "trainer.lora.target_modules=[qproj, embed_tokens]"]))
    assert "'qproj', which matches no module of model tiny-random: its Linear layers are named ['down_proj', " in str(e.value)
    assert "'embed_tokens', which matches model.embed_tokens (Embedding), not a Linear" in str(e.value)
    with pytest.raises(RecipeError, match=r"trainer.lora.rank=129 is larger than the smallest dimension of targeted "
                                          r"module model.layers.0.self_attn.q_proj \(\[128, 128\]\) .* set "
                                          r"trainer.lora.rank <= 128"):  # fmt: skip
        preflight(load_recipe(TINY, ["trainer.lora.rank=129"]))
    # gate_proj alone: its smallest dimension is 128 too; 128 fits
    assert preflight(load_recipe(TINY, ["trainer.lora.rank=128", "trainer.lora.target_modules=[mlp.gate_proj]"]))[-1] == (
        "checked: trainer.lora rank 128 on 2 Linear modules of model tiny-random (smallest dimension 128)")


def test_target_names_match_whole_dotted_parts_as_peft():
    """PEFT's rule for a list: the full name, or its last dotted parts; never a part of a part."""
    from rlvr.train.lora import matches

    name = "model.layers.0.self_attn.q_proj"
    assert [t for t in ("q_proj", "self_attn.q_proj", name, "proj", "_proj", "attn.q_proj", "q") if matches(name, t)] == [
        "q_proj", "self_attn.q_proj", name]
