"""``rlvr serve`` (issue 43) on its real backends, through the ``tinker`` SDK: DeepSpeed and full fine-tuning give
the torch backend's numbers, and a vLLM engine serves what the trainer holds after ``save_weights_for_sampler``.

- torch vs DeepSpeed (ZeRO-2 at one rank, the recipe default), LoRA and full fine-tuning: the same datum, one
  ``forward_backward`` + ``optim_step``, then ``forward``: the logprobs after the step agree to 1e-5 between the
  backends (the same AdamW, the same gradient), and full fine-tuning moves them where LoRA's first step (B = 0
  before it) moves them differently;
- vLLM (float32, tiny-random, local executor): the engine's prompt logprobs (``compute_logprobs``) equal the
  trainer's ``forward`` logprobs before and after an update pushed by ``save_weights_for_sampler`` (the checked
  sync), and differ between the two; a sampler whose weights were replaced is refused with a message saying so.
"""

from __future__ import annotations

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


def _after_one_step(tmp_path, *overrides: str, full: bool) -> tuple[np.ndarray, np.ndarray, bool]:
    """(logprobs before, logprobs after one cross_entropy step at lr 1e-2, whether the model is LoRA)."""
    bg = Background(ServeOptions(model="tiny-random", state_dir=str(tmp_path), max_context=64, full=full,
                                 overrides=BASE + ("rollout.engine=hf",) + overrides))
    try:
        sc = tinker.ServiceClient(base_url=bg.url)
        tc = sc.create_lora_training_client(base_model="tiny-random", rank=4).result()
        before = tc.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        tc.forward_backward([_datum()], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2, eps=1e-8)).result()
        after = tc.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        lora = bool(tc.get_info().is_lora)
        sc.close("success").result(timeout=30)
        return before, after, lora
    finally:
        bg.stop()


@pytest.mark.parametrize("full", [False, True], ids=["lora", "full"])
def test_deepspeed_takes_the_step_the_torch_backend_takes(tmp_path, full):
    b_t, a_t, lora_t = _after_one_step(tmp_path / "torch", "trainer.backend=torch", full=full)
    b_d, a_d, lora_d = _after_one_step(tmp_path / "ds", "trainer.backend=deepspeed", full=full)
    assert lora_t is lora_d is (not full)
    np.testing.assert_allclose(b_d, b_t, atol=1e-6)
    assert np.abs(a_t - b_t).max() > 1e-3  # the step moved the model (cross_entropy: the targets' logprobs rise)
    assert a_t.sum() > b_t.sum()
    np.testing.assert_allclose(a_d, a_t, atol=1e-5)


def test_vllm_serves_what_the_trainer_holds_after_each_sampler_save(tmp_path):
    bg = Background(ServeOptions(model="tiny-random", state_dir=str(tmp_path), max_context=64, full=True,
                                 overrides=BASE + ("rollout.engine=vllm", "rollout.kv_cache_gib=0.25")))
    try:
        sc = tinker.ServiceClient(base_url=bg.url)
        tc = sc.create_lora_training_client(base_model="tiny-random", rank=4).result()
        prompt = types.ModelInput.from_ints(TOKENS)
        s0 = tc.save_weights_and_get_sampling_client().result()
        engine0 = np.array(s0.compute_logprobs(prompt).result()[1:], dtype=np.float64)
        trainer0 = tc.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        np.testing.assert_allclose(engine0, trainer0, atol=2e-4)

        tc.forward_backward([_datum()], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2, eps=1e-8)).result()
        s1 = tc.save_weights_and_get_sampling_client().result()  # the checked sync to the engine
        engine1 = np.array(s1.compute_logprobs(prompt).result()[1:], dtype=np.float64)
        trainer1 = tc.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        assert np.abs(engine1 - engine0).max() > 1e-3
        np.testing.assert_allclose(engine1, trainer1, atol=2e-4)

        seqs = s1.sample(prompt, 3, types.SamplingParams(max_tokens=4, seed=3)).result().sequences
        assert len(seqs) == 3 and all(1 <= len(s.tokens) <= 4 for s in seqs)
        with pytest.raises(Exception, match="replaced on the engines"):
            s0.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result()
        sc.close("success").result(timeout=30)
    finally:
        bg.stop()
