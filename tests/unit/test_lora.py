"""LoRA on the policy (issue 28, first part: ``trainer.lora`` with the merged sync), on CPU with the tiny model:
the recipe refusals, only the adapters train, the reference is the base model, the merged weights are
W + (alpha / r) B A under the checkpoint's names, and a checkpoint of the adapters resumes exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr.recipe import load_recipe

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")
SMALL = ["run.executor=local", "model.dtype=float32", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2",
         "trainer.micro_batch_size=2", "trainer.lr=1e-2"]  # fmt: skip
LORA = ["trainer.lora.rank=4", "trainer.lora.alpha=8"]


def _batch():
    from rlvr.train.batch import pack
    from rlvr.types import Completion

    comps = [Completion(prompt_index=i // 2, sample_index=i % 2, prompt_ids=[1, 4, 41, 5, 6], token_ids=[6 + i, 7, 9, 2],
                        logprobs=[-1.0, -2.0, -0.5, -1.5], text="x", finish_reason="stop", policy_version=0)
             for i in range(4)]  # fmt: skip
    return pack(comps, torch.tensor([1.0, -1.0, 0.5, -0.5]), 0, 8)


def _worker(*overrides: str):
    from rlvr.models import resolve_model
    from rlvr.train.policy import PolicyWorker

    return PolicyWorker(load_recipe(TINY, [*SMALL, *overrides]), resolve_model("tiny-random"), 0, 1, "127.0.0.1", 0)


def _randomise_b(worker, seed: int = 0) -> None:
    """Give every B a random value (it starts at zero, where the policy is the base model)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in worker.module.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def _hf_logprobs(model, batch) -> torch.Tensor:
    """[B, S-1] logprobs of each next token by a plain transformers forward at temperature 1, zero off the
    response (the trainer's own layout), computed without rlvr's code."""
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    return lp * batch.loss_mask


# -- the merged weight ----------------------------------------------------------------------------------------------
def test_merged_weight_is_w_plus_scaled_b_a_by_hand():
    """One Linear, W [2, 3] = [[1, 2, 3], [4, 5, 6]], r = 1, alpha = 2 (scale alpha / r = 2), A [1, 3] =
    [[1, 0, -1]], B [2, 1] = [[2], [-1]]: B A = [[2, 0, -2], [-1, 0, 1]], merged = W + 2 B A =
    [[5, 2, -1], [2, 5, 8]]. The layer's own forward agrees (x = [1, 1, 1]: merged x = [6, 15]), W is unchanged."""
    from peft import LoraConfig, get_peft_model

    from rlvr.train.lora import merged_named_weights

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(3, 2, bias=False)

        def forward(self, x):
            return self.proj(x)

    net = Net()
    with torch.no_grad():
        net.proj.weight.copy_(torch.tensor([[1.0, 2, 3], [4, 5, 6]]))
    model = get_peft_model(net, LoraConfig(r=1, lora_alpha=2, target_modules=["proj"]))
    with torch.no_grad():
        model.base_model.model.proj.lora_A["default"].weight.copy_(torch.tensor([[1.0, 0, -1]]))
        model.base_model.model.proj.lora_B["default"].weight.copy_(torch.tensor([[2.0], [-1.0]]))
    merged = dict(merged_named_weights(model, torch.float32))
    assert list(merged) == ["proj.weight"]  # the base model's name: no base_model.model. prefix, no .base_layer
    assert torch.equal(merged["proj.weight"], torch.tensor([[5.0, 2, -1], [2, 5, 8]]))
    assert torch.equal(model(torch.ones(1, 3)).detach(), torch.tensor([[6.0, 15.0]]))
    assert torch.equal(model.base_model.model.proj.base_layer.weight, torch.tensor([[1.0, 2, 3], [4, 5, 6]]))


def test_sync_names_and_shapes_are_the_checkpoints():
    """What a merged sync sends is named and shaped as the model folder's safetensors (what the engine loaded),
    in the order weight_specs gives, and the merged tensors differ from the base weights only where adapters are."""
    from safetensors import safe_open

    from rlvr.models import resolve_model

    w = _worker(*LORA, "trainer.lora.target_modules=[q_proj, down_proj]")
    _randomise_b(w)
    with safe_open(str(Path(resolve_model("tiny-random")) / "model.safetensors"), "pt") as f:
        ckpt = {k: f.get_tensor(k) for k in f.keys()}
    specs = w.weight_specs()
    sent = dict(w._named_weights())
    assert [n for n, _, _ in specs] == list(sent)
    assert {n: s for n, s, _ in specs} == {k: tuple(t.shape) for k, t in ckpt.items()}
    changed = sorted(n for n in ckpt if not torch.equal(sent[n], ckpt[n]))
    assert changed == sorted(f"model.layers.{i}.{m}.weight" for i in (0, 1) for m in ("self_attn.q_proj", "mlp.down_proj"))


def test_adapter_sync_sends_what_peft_saves(tmp_path):
    """``trainer.lora.sync=adapter``: the sync's specs and tensors are exactly PEFT's ``adapter_model.safetensors``
    (names, shapes, values in the sync dtype) and its ``adapter_config.json`` is PEFT's own: the folder an engine
    writes from them is the folder ``save_pretrained`` writes. Shapes by hand (tiny-random, r = 4): q_proj A [4, 128],
    B [128, 4]; down_proj A [4, 256], B [128, 4]; 2 layers x 2 modules x (A, B) = 8 tensors."""
    import json

    from safetensors.torch import load_file

    w = _worker(*LORA, "trainer.lora.target_modules=[q_proj, down_proj]", "trainer.lora.sync=adapter")
    _randomise_b(w)
    w.module.save_pretrained(str(tmp_path))
    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    specs = w.weight_specs()
    sent = dict(w._sync_weights())
    assert [n for n, _, _ in specs] == list(sent) and set(sent) == set(saved)
    assert {n: s for n, s, _ in specs} == {
        f"base_model.model.model.layers.{i}.{m}.{ab}.weight": shape for i in (0, 1)
        for m, shapes in (("self_attn.q_proj", ((4, 128), (128, 4))), ("mlp.down_proj", ((4, 256), (128, 4))))
        for ab, shape in zip(("lora_A", "lora_B"), shapes)}  # fmt: skip
    assert all(torch.equal(sent[n], saved[n]) for n in saved)
    ours, peft_own = json.loads(w.adapter_config()), json.loads((tmp_path / "adapter_config.json").read_text())
    # PEFT keeps target_modules as a set: its JSON list comes in the set's iteration order, which a copy of the set
    # may change (a flaky failure in CI: ['down_proj', 'q_proj'] against ['q_proj', 'down_proj'])
    assert sorted(ours.pop("target_modules")) == sorted(peft_own.pop("target_modules")) == ["down_proj", "q_proj"]
    assert ours == peft_own
    assert len(dict(w._named_weights())) == 21  # save_pretrained and the checksum still see the merged model


@pytest.mark.parametrize("backend", ["torch", "deepspeed"])
def test_bf16_frozen_linears_change_nothing_but_memory(backend):
    """model.dtype=bfloat16 (autocast): the frozen Linears are stored in bf16, the adapters, embeddings and norms
    stay fp32, and the logprobs and the adapters' gradients are bit for bit those of the same model with its frozen
    Linears in fp32 (autocast rounds an fp32 weight to bf16 at each forward: the same numbers). Count by hand:
    tiny-random, 2 layers x (q, k, v, o [128, 128]; gate, up [256, 128]; down [128, 256]) = 2 x 163840."""
    w = _worker(*LORA, "model.dtype=bfloat16", f"trainer.backend={backend}")
    _randomise_b(w)
    named = dict(w.module.named_parameters())
    low = sorted(n for n, p in named.items() if p.dtype == torch.bfloat16)
    assert sum(named[n].numel() for n in low) == 2 * 163840
    assert all(".base_layer." in n for n in low) and all(named[n].dtype == torch.float32 for n in named if ".lora_" in n)
    batch = _batch()

    def lp_and_grads():
        w.module.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lp, _ = w._forward(w.module, batch, need_entropy=False)
        (lp.float() * batch.loss_mask).sum().backward()
        return lp.detach().clone(), {n: p.grad.clone() for n, p in named.items() if p.grad is not None}

    lp16, g16 = lp_and_grads()
    for n in low:
        named[n].data = named[n].data.float()
    lp32, g32 = lp_and_grads()
    assert torch.equal(lp16, lp32) and set(g16) == set(g32) and len(g16) == 2 * 14
    assert all(torch.equal(g16[n], g32[n]) for n in g16)


def test_vllm_max_rank_is_the_smallest_it_accepts():
    from rlvr.train.lora import vllm_max_rank

    assert [vllm_max_rank(r) for r in (1, 2, 8, 9, 16, 33, 320, 321, 512)] == [1, 8, 8, 16, 16, 64, 320, 512, 512]
    with pytest.raises(ValueError, match="above vLLM's largest"):
        vllm_max_rank(513)


class _ScriptedVLLM:
    """What VLLMEngine.receive_adapter asks of vLLM's ``LLM``, scripted: the workers' receive (writes the folder),
    add/remove/list of LoRA ids, the prefix-cache reset."""

    def __init__(self) -> None:
        self.llm_engine = self
        self.ids: set[int] = set()
        self.resets = 0

    def collective_rpc(self, method, args):
        import os

        assert method == "rlvr_receive_adapter"
        os.makedirs(args[2], exist_ok=True)
        return [1.5]

    def add_lora(self, req):
        self.ids.add(req.lora_int_id)
        return True

    def remove_lora(self, lora_id):
        self.ids.discard(lora_id)
        return True

    def list_loras(self):
        return set(self.ids)

    def reset_prefix_cache(self):
        self.resets += 1

    @property
    def engine_core(self):  # shutdown
        return self

    def shutdown(self):
        pass


def test_engine_keeps_the_last_slots_versions_registered():
    """lora_slots = 2 (max_staleness 1): after versions 1, 2, 3 the engine serves v3, vLLM holds ids 3 and 4
    (version + 1) and v1's id 2 and folder are gone; the prefix cache was dropped at each swap; the same version
    again (an engine restart) replaces its id rather than adding a third."""
    import os

    from rlvr.rollout.vllm_engine import VLLMEngine

    e = VLLMEngine.__new__(VLLMEngine)
    e.llm, e.lora_slots, e._lora, e._loras, e._lora_dir, e.policy_version = _ScriptedVLLM(), 2, None, [], None, 0
    for v in (1, 2, 3):
        assert e.receive_adapter([], v, 0.0, "{}") == [1.5]
    assert e._lora.lora_name == "rlvr-v3" and e._lora.lora_int_id == 4 and e.policy_version == 3
    assert e.llm.ids == {3, 4} and [r.lora_int_id for r in e._loras] == [3, 4]
    assert sorted(os.listdir(e._lora_dir)) == ["v2", "v3"] and e.llm.resets == 3
    e.receive_adapter([], 3, 0.0, "{}")
    assert e.llm.ids == {3, 4} and [r.lora_int_id for r in e._loras] == [3, 4]
    d = e._lora_dir
    e.shutdown()
    assert not os.path.exists(d)


# -- training -------------------------------------------------------------------------------------------------------
def test_gradients_and_updates_only_on_adapters():
    w = _worker(*LORA)
    _randomise_b(w)  # at B = 0 A's gradient is 0: with B random both get one
    opt_params = {id(p) for g in w.optimizer.param_groups for p in g["params"]}
    named = dict(w.module.named_parameters())
    assert opt_params == {id(p) for n, p in named.items() if ".lora_" in n}
    assert len(opt_params) == 2 * 14  # A and B of 7 projections x 2 layers
    batch = _batch()
    lp, _ = w._forward(w.module, batch, need_entropy=False)
    (lp * batch.loss_mask).sum().backward()
    for n, p in named.items():
        assert (p.grad is not None and float(p.grad.abs().sum()) > 0) == (".lora_" in n), n
    w.optimizer.zero_grad(set_to_none=True)
    before = {n: p.detach().clone() for n, p in named.items()}
    w.train_step(batch)
    for n, p in named.items():
        assert torch.equal(p, before[n]) != (".lora_" in n), n  # adapters moved, nothing else


def test_reference_is_the_base_model_and_the_policy_is_the_merged_model(tmp_path):
    """With random B the policy differs from the base model; the reference (adapters off, no second copy) equals
    the model folder's logprobs by a plain transformers forward; the policy equals a transformers model loaded from
    save_pretrained's merged weights; the adapter folder beside them rebuilds the policy with PEFT."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlvr.models import resolve_model

    w = _worker(*LORA, "algorithm.kl_coef=0.1")
    assert w.ref is None
    _randomise_b(w)
    batch = _batch()
    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-random"), dtype=torch.float32).eval()
    want_ref = _hf_logprobs(base, batch)
    ref = w.compute_logprobs(batch, reference=True, temperature=1.0)
    pol = w.compute_logprobs(batch, temperature=1.0)
    assert torch.allclose(ref, want_ref, atol=1e-5)
    assert float((pol - want_ref).abs().max()) > 1e-2  # the adapters do something
    out = w.save_pretrained(str(tmp_path / "final"))
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert torch.allclose(_hf_logprobs(merged, batch), pol, atol=1e-5)
    assert sorted(p.name for p in (tmp_path / "final" / "adapter").iterdir()) == [
        "README.md", "adapter_config.json", "adapter_model.safetensors"]
    peft = PeftModel.from_pretrained(base, str(tmp_path / "final" / "adapter")).eval()
    assert torch.allclose(_hf_logprobs(peft, batch), pol, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "deepspeed"])
def test_two_updates_equal_one_saved_and_one_resumed(tmp_path, backend):
    """Adapters and their AdamW state round-trip through a checkpoint: 1 update, save, a fresh worker loads it and
    takes the 2nd, equal (exactly) to 2 updates in one worker; the checkpoint holds no base weight."""
    over = [*LORA, f"trainer.backend={backend}"]
    batch = _batch()
    a = _worker(*over)
    a.train_step(batch)
    a.train_step(batch)
    b = _worker(*over)
    b.train_step(batch)
    b.save_state(str(tmp_path / "ck"))
    if backend == "torch":
        saved = torch.load(tmp_path / "ck" / "torch_state.pt", weights_only=False)["model"]
        assert saved and all(".lora_" in n for n in saved)
    c = _worker(*over)
    assert c.load_state(str(tmp_path / "ck")) == 1
    c.train_step(batch)
    pa, pc = dict(a.module.named_parameters()), dict(c.module.named_parameters())
    moved = [n for n in pa if ".lora_B" in n]
    assert moved and all(float(pa[n].detach().abs().max()) > 0 for n in moved)
    for n in pa:
        assert torch.equal(pa[n], pc[n]), n


def test_adapters_start_the_same_on_every_rank():
    """A's init comes from run.seed alone, not the rank's own torch seed (trainer_seed(seed, rank)): two ranks'
    adapters start equal, another run.seed gives others, and the caller's RNG stream is left where it was."""
    from transformers import AutoModelForCausalLM

    from rlvr.models import resolve_model
    from rlvr.train.lora import adapter_state, wrap

    cfg = load_recipe(TINY, LORA).trainer.lora

    def adapters(rank_seed: int, run_seed: int):
        torch.manual_seed(rank_seed)
        m = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-random"), dtype=torch.float32)
        state = adapter_state(wrap(m, cfg, seed=run_seed))
        return state, torch.rand(1)

    (a0, r0), (a1, r1), (b, _) = adapters(100, 1), adapters(101, 1), adapters(100, 2)
    assert all(torch.equal(a0[n], a1[n]) for n in a0)
    assert not all(torch.equal(a0[n], b[n]) for n in a0 if "lora_A" in n)
    torch.manual_seed(100)
    assert torch.equal(r0, torch.rand(1)) and not torch.equal(r0, r1)
