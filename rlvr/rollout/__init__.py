"""Rollout engines. ``ENGINES`` maps ``rollout.engine`` (and ``rlvr eval --engine``) to the engine class, loaded
on first use (vLLM is a heavy import): ``engine_class("vllm")``.

Every engine takes ``(model_dir, *, dtype, max_model_len, seed, threads, **engine_options)`` and implements
:class:`rlvr.rollout.base.Engine`.
"""

from __future__ import annotations

from typing import Callable

from rlvr.registry import Registry

ENGINES: Registry[Callable[[], type]] = Registry("engine")
"""Engine name -> a zero-argument loader returning the engine class."""


def _vllm() -> type:
    from rlvr.rollout.vllm_engine import VLLMEngine

    return VLLMEngine


def _hf() -> type:
    from rlvr.rollout.hf_engine import HFEngine

    return HFEngine


ENGINES.add("vllm", _vllm)
ENGINES.add("hf", _hf)


def engine_class(name: str) -> type:
    """The engine class registered as ``name``. Errors: ``KeyError`` naming the nearest registered engines."""
    return ENGINES.get(name)()
