"""Teach tinker-cookbook 0.5.8 about HuggingFaceTB/SmolLM2-135M-Instruct, without editing it.

Installed into the client venv (``scripts/tinker_client_env.sh``) as this module plus
``rlvr_smollm2_hook.pth``, which imports it at interpreter start. Importing it does
nothing but add an import hook; the cookbook is patched only when a program imports it:

- after ``tinker_cookbook.renderers`` loads: registers the renderer ``"smollm2"``
  (``renderers.register_renderer``, the cookbook's own extension point) -- the cookbook's
  ``qwen3_instruct`` ChatML renderer plus SmolLM2's default system message, which
  SmolLM2's chat template inserts when a conversation does not start with a system
  message (the same way the cookbook's Kimi K2 renderer handles Kimi's default);
- after ``tinker_cookbook.model_info`` loads: makes ``get_model_attributes`` answer for
  ``HuggingFaceTB/SmolLM2-135M-Instruct`` (organization HuggingFaceTB, 135M, chat,
  recommended renderer ``"smollm2"``), since model_info has no registration API and
  ``rl_loop.py``/``sl_loop.py`` call ``get_recommended_renderer_name`` unconditionally.
  Every other name goes to the cookbook's own function unchanged.

The model is not presented as a Llama or Qwen model anywhere: only the ChatML token
layout is shared with Qwen's renderer (examples/tinker_cookbook/README.md, "Renderer",
has the token-by-token comparison with SmolLM2's own chat template).

Set ``RLVR_SMOLLM2_HOOK=0`` to switch the hook off.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
RENDERER_NAME = "smollm2"
# Verbatim from SmolLM2-135M-Instruct's chat template.
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def _patch_renderers(renderers_module) -> None:
    from tinker_cookbook.renderers.qwen3 import Qwen3InstructRenderer

    class SmolLM2Renderer(Qwen3InstructRenderer):
        """SmolLM2's ChatML format: ``<|im_start|>role\\ncontent<|im_end|>\\n``, stop on
        ``<|im_end|>``, no thinking tags, and the default system message when none is given."""

        def _ensure_system_message(self, messages):
            if messages and messages[0]["role"] != "system":
                return [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, *messages]
            return messages

        def build_generation_prompt(self, messages, role="assistant", prefill=None):
            return super().build_generation_prompt(self._ensure_system_message(messages), role=role, prefill=prefill)

        def build_supervised_example(self, messages, train_on_what=None, **kwargs):
            if train_on_what is not None:
                kwargs["train_on_what"] = train_on_what
            return super().build_supervised_example(self._ensure_system_message(messages), **kwargs)

    SmolLM2Renderer.__module__ = __name__
    globals()["SmolLM2Renderer"] = SmolLM2Renderer
    if not renderers_module.is_renderer_registered(RENDERER_NAME):
        renderers_module.register_renderer(
            RENDERER_NAME, lambda tokenizer, image_processor=None: SmolLM2Renderer(tokenizer)
        )


def _patch_model_info(model_info) -> None:
    original = model_info.get_model_attributes
    if getattr(original, "_rlvr_smollm2", False):
        return

    def get_model_attributes(model_name: str):
        if model_name.split(":", 1)[0] == MODEL_NAME:
            return model_info.ModelAttributes(
                organization="HuggingFaceTB",
                version_str="2",
                size_str="135M",
                is_chat=True,
                recommended_renderers=(RENDERER_NAME,),
            )
        return original(model_name)

    get_model_attributes.__doc__ = original.__doc__
    get_model_attributes._rlvr_smollm2 = True  # type: ignore[attr-defined]
    model_info.get_model_attributes = get_model_attributes


_PATCHES = {
    "tinker_cookbook.renderers": _patch_renderers,
    "tinker_cookbook.model_info": _patch_model_info,
}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner, patch):
        self._inner = inner
        self._patch = patch

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def install() -> None:
    if os.environ.get("RLVR_SMOLLM2_HOOK", "1") == "0":
        return
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    for name, patch in _PATCHES.items():  # already imported (hook installed late): patch now
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _Finder())


install()
