"""A trainer rank's checkpoint written in the background (checkpoint.async_write; rlvr.train.ckpt_write): the files
hold the state as it was when save_state was called, whatever the rank does next, and a failed write is raised."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr.recipe import load_recipe
from rlvr.train.ckpt_write import Writer, host_copy

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")
SMALL = ["run.executor=local", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2", "trainer.micro_batch_size=2"]


def test_host_copy_is_not_reached_by_later_in_place_updates():
    w = torch.ones(3)
    tree = {"model": {"w": w}, "optimizer": {"state": {0: {"step": torch.tensor(1.0), "lr": 0.1}}, "groups": [1, 2]}}
    snap = host_copy(tree)
    w.add_(1.0)
    tree["optimizer"]["state"][0]["step"] += 1
    tree["optimizer"]["groups"].append(3)
    assert torch.equal(snap["model"]["w"], torch.ones(3)) and float(snap["optimizer"]["state"][0]["step"]) == 1.0
    assert snap["optimizer"]["groups"] == [1, 2] and snap["optimizer"]["state"][0]["lr"] == 0.1


def test_a_failed_write_is_raised_by_wait():
    def fails():
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        Writer(fails, "checkpoint step_000001").wait(5.0)


def _batch(seed: int):
    from rlvr.train.batch import pack
    from rlvr.types import Completion

    g = torch.Generator().manual_seed(seed)
    comps = [Completion(prompt_index=i // 2, sample_index=i % 2, prompt_ids=[1, 4, 41, 5],
                        token_ids=torch.randint(3, 40, (3,), generator=g).tolist(), logprobs=[-1.0, -2.0, -0.5],
                        text="x", finish_reason="stop", policy_version=0) for i in range(4)]  # fmt: skip
    return pack(comps, torch.tensor([1.0, -1.0, 0.5, -0.5]), 0, 8)


class _Deferred:
    """A Writer whose job runs only when waited for: the files are written after whatever the rank did next (the
    worst case of a real thread, made certain)."""

    def __init__(self, job, name):
        self.job = job

    def wait(self, timeout_s=None):
        self.job()


def test_the_background_files_hold_the_state_of_the_call_not_of_the_next_update(tmp_path, monkeypatch):
    """The torch backend, tiny model: update 1, save in the background, update 2 (it changes every weight and the
    Adam moments) before the files are written, then wait. A worker that loads the files holds update 1's weights
    and moments exactly, as does one loaded from a checkpoint written in the call; the HF weights too."""
    from safetensors.torch import load_file

    from rlvr.models import resolve_model
    from rlvr.train import policy
    from rlvr.train.policy import PolicyWorker

    monkeypatch.setattr(policy, "Writer", _Deferred)

    model_dir, r = resolve_model("tiny-random"), load_recipe(TINY, [*SMALL, "trainer.lr=1e-2"])
    w = PolicyWorker(r, model_dir, 0, 1, "127.0.0.1", 0)
    w.train_step(_batch(0))
    after1 = {n: t.clone() for n, t in w.module.state_dict().items()}
    w.save_state(str(tmp_path / "sync"))
    w.save_state(str(tmp_path / "bg"), True)
    w.train_step(_batch(1))
    assert any(not torch.equal(after1[n], t) for n, t in w.module.state_dict().items())  # update 2 moved them
    assert w.wait_saved() and w.wait_saved()  # a second wait: nothing left to wait for
    for name in ("sync", "bg"):
        back = PolicyWorker(r, model_dir, 0, 1, "127.0.0.1", 0)
        assert back.load_state(str(tmp_path / name)) == 1
        assert all(torch.equal(after1[n], t) for n, t in back.module.state_dict().items()), name
    a = torch.load(tmp_path / "sync" / "torch_state.pt", weights_only=False)["optimizer"]["state"]
    b = torch.load(tmp_path / "bg" / "torch_state.pt", weights_only=False)["optimizer"]["state"]
    assert all(torch.equal(a[i]["exp_avg_sq"], b[i]["exp_avg_sq"]) for i in a)
    ha, hb = load_file(str(tmp_path / "sync" / "hf" / "model.safetensors")), load_file(str(tmp_path / "bg" / "hf" / "model.safetensors"))
    assert ha.keys() == hb.keys() and all(torch.equal(ha[k], hb[k]) for k in ha)
    import json

    for name in ("sync", "bg"):  # the folder vLLM and rlvr eval load: the recipe's dtype, the model's generation config
        hf = tmp_path / name / "hf"
        cfg = json.loads((hf / "config.json").read_text())
        assert cfg["torch_dtype"] == cfg["dtype"] == "float32"
        gen = Path(model_dir) / "generation_config.json"
        assert (hf / "generation_config.json").exists() == gen.exists()
        if gen.exists():
            assert (hf / "generation_config.json").read_text() == gen.read_text()
        assert not Path(str(hf) + ".tmp").exists()


def test_tied_weights_stay_one_tensor_in_the_copy():
    """A model's tied input embedding and output head: two state-dict entries, one storage. The copy keeps them one
    tensor (torch.save then writes them once, as for the originals: 0.11 GB of SmolLM2-135M's checkpoint)."""
    emb = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight
    sd = {"emb.weight": emb.weight.detach(), "head.weight": head.weight.detach(), "other": torch.zeros(2)}
    snap = host_copy(sd)
    assert snap["emb.weight"] is snap["head.weight"] and snap["other"] is not snap["emb.weight"]
    assert snap["emb.weight"].data_ptr() != emb.weight.data_ptr()
    half = host_copy({"a": sd["other"][:1], "b": sd["other"][1:]})  # views of one storage at other offsets
    assert half["a"] is not half["b"]


def test_the_hf_folder_says_the_recipes_dtype_whatever_the_module_holds(tmp_path):
    """An fp32 module (a trainer's master weights) written for a bf16 recipe: config.json's ``dtype`` and
    ``torch_dtype`` both say bfloat16, the dtype vLLM and rlvr eval then load it in."""
    import json

    from transformers import AutoModelForCausalLM

    from rlvr.models import resolve_model
    from rlvr.train.ckpt_write import write_pretrained

    model_dir = resolve_model("tiny-random")
    module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = write_pretrained(module, dict(module.state_dict()), str(tmp_path / "hf"), model_dir,
                           load_recipe(TINY, [*SMALL, "model.dtype=bfloat16"]))  # fmt: skip
    cfg = json.loads((Path(out) / "config.json").read_text())
    assert (cfg["dtype"], cfg["torch_dtype"]) == ("bfloat16", "bfloat16")
