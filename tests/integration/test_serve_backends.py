"""``rlvr serve`` (issue 43) on its real backends, through the ``tinker`` SDK: DeepSpeed and full fine-tuning give
the torch backend's numbers, and a vLLM engine serves what the trainer holds after ``save_weights_for_sampler``.

- torch vs DeepSpeed (ZeRO-2 at one rank, the recipe default), LoRA and full fine-tuning: the same datum, one
  ``forward_backward`` + ``optim_step``, then ``forward``: the logprobs after the step agree to 1e-5 between the
  backends (the same AdamW, the same gradient), and full fine-tuning moves them where LoRA's first step (B = 0
  before it) moves them differently;
- vLLM (float32, tiny-random, local executor): the engine's prompt logprobs (``compute_logprobs``) equal the
  trainer's ``forward`` logprobs before and after an update pushed by ``save_weights_for_sampler`` (the checked
  sync), and differ between the two; a sampler whose weights were replaced is refused with a message saying so.

Each case runs in a child process (``in_child.call_in_child``): DeepSpeed, and vLLM in this process, leave
torch.distributed state behind that a later test's trainer would trip on.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("uvicorn")

from tinker import types  # noqa: E402

from rlvr.serve.app import Background  # noqa: E402
from rlvr.serve.server import ServeOptions  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BASE = ("run.executor=local", "model.dtype=float32", "sync.probe_every=0")
TOKENS = [5, 9, 14, 20, 7, 11, 30, 12, 6, 25]  # ordinary tiny-random ids (characters)


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")


def _datum() -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(TOKENS[:-1]),
                       loss_fn_inputs={"target_tokens": TOKENS[1:], "weights": [1.0] * (len(TOKENS) - 1)})


def after_one_step(state_dir: str, overrides: list[str], full: bool) -> tuple[list, list, bool]:
    """(logprobs before, logprobs after one cross_entropy step at lr 1e-2, whether the model is LoRA); run in a
    child process."""
    os.environ.setdefault("TINKER_API_KEY", "tml-test")
    bg = Background(ServeOptions(model="tiny-random", state_dir=state_dir, max_context=64, full=full,
                                 overrides=BASE + ("rollout.engine=hf",) + tuple(overrides)))
    try:
        sc = tinker.ServiceClient(base_url=bg.url)
        tc = sc.create_lora_training_client(base_model="tiny-random", rank=4).result()
        before = tc.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        tc.forward_backward([_datum()], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2, eps=1e-8)).result()
        after = tc.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        lora = bool(tc.get_info().is_lora)
        sc.close("success").result(timeout=30)
        return before.tolist(), after.tolist(), lora
    finally:
        bg.stop()


@pytest.mark.parametrize("full", [False, True], ids=["lora", "full"])
def test_deepspeed_takes_the_step_the_torch_backend_takes(tmp_path, full):
    from in_child import call_in_child

    def run(backend: str):
        b, a, lora = call_in_child("test_serve_backends", "after_one_step", str(tmp_path / backend),
                                   [f"trainer.backend={backend}"], full, timeout_s=300)
        return np.array(b), np.array(a), lora

    b_t, a_t, lora_t = run("torch")
    b_d, a_d, lora_d = run("deepspeed")
    assert lora_t is lora_d is (not full)
    np.testing.assert_allclose(b_d, b_t, atol=1e-6)
    assert np.abs(a_t - b_t).max() > 1e-3  # the step moved the model (cross_entropy: the targets' logprobs rise)
    assert a_t.sum() > b_t.sum()
    np.testing.assert_allclose(a_d, a_t, atol=1e-5)


def test_vllm_serves_what_the_trainer_holds_after_each_sampler_save(tmp_path):
    from in_child import call_in_child

    got = call_in_child("test_serve_backends", "vllm_case", str(tmp_path), timeout_s=400)
    engine0, trainer0, engine1, trainer1 = (np.array(got[k]) for k in ("engine0", "trainer0", "engine1", "trainer1"))
    np.testing.assert_allclose(engine0, trainer0, atol=2e-4)
    assert np.abs(engine1 - engine0).max() > 1e-3  # the update reached the engine
    np.testing.assert_allclose(engine1, trainer1, atol=2e-4)
    assert got["lengths"] and all(1 <= n <= 4 for n in got["lengths"]) and len(got["lengths"]) == 3
    assert "replaced on the engines" in got["old_sampler_error"]


def vllm_case(state_dir: str) -> dict:
    """The vLLM case's measurements (in a child process): the engine's and the trainer's logprobs of TOKENS before
    and after one step pushed by save_weights_for_sampler, three samples' lengths, the old sampler's error."""
    os.environ.setdefault("TINKER_API_KEY", "tml-test")
    bg = Background(ServeOptions(model="tiny-random", state_dir=state_dir, max_context=64, full=True,
                                 overrides=BASE + ("rollout.engine=vllm", "rollout.kv_cache_gib=0.25")))
    try:
        sc = tinker.ServiceClient(base_url=bg.url)
        tc = sc.create_lora_training_client(base_model="tiny-random", rank=4).result()
        prompt = types.ModelInput.from_ints(TOKENS)
        out: dict = {}
        s0 = tc.save_weights_and_get_sampling_client().result()
        out["engine0"] = s0.compute_logprobs(prompt).result()[1:]
        out["trainer0"] = tc.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
        tc.forward_backward([_datum()], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2, eps=1e-8)).result()
        s1 = tc.save_weights_and_get_sampling_client().result()  # the checked sync to the engine
        out["engine1"] = s1.compute_logprobs(prompt).result()[1:]
        out["trainer1"] = tc.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
        seqs = s1.sample(prompt, 3, types.SamplingParams(max_tokens=4, seed=3)).result().sequences
        out["lengths"] = [len(x.tokens) for x in seqs]
        try:
            s0.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result()
            out["old_sampler_error"] = ""
        except Exception as e:  # noqa: BLE001 - the refusal's text is what the test checks
            out["old_sampler_error"] = str(e)
        sc.close("success").result(timeout=30)
        return out
    finally:
        bg.stop()
