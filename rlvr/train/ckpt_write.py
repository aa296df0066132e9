"""Writing a trainer rank's checkpoint files, now or in the background (``checkpoint.async_write``, issue 41).

In the background, the rank first snapshots what it writes (its weights, the optimizer's state, the Hugging Face
weights: copies in host memory, so the next update may change the originals at once), then a thread of its process
writes the files while the run goes on; :meth:`Writer.wait` joins it and raises what it raised. The controller
commits the checkpoint (``COMPLETE``, the atomic rename) only after every rank's wait returned, so a crash while
writing leaves a folder that no resume takes (:func:`rlvr.runtime.checkpoint.latest_complete`).

Measured (``benchmarks/checkpoint_cost.py``, the smoke recipe on 2 CPU cores: 1.89 GB a checkpoint): written
in the rank's call, a checkpoint held the run 7.35 s (0.28 of a 26 s step); the snapshot alone takes 0.45-0.64 s
(SmolLM2-135M's fp32 weights and AdamW's moments), and the writing then overlaps the next step's generation, while
the trainer waits anyway. The snapshot costs host memory the size of the files while they are written.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def host_copy(tree: Any, _memo: dict | None = None) -> Any:
    """A copy of ``tree`` (dicts, lists, tuples of tensors and plain values) whose tensors are new host-memory
    tensors (``detach().to("cpu", copy=True)``), so that later in-place updates of the originals do not reach it.
    Tensors that are views of one storage alike (tied weights: a model's input embedding and output head) are
    copied once and stay one tensor, so the files hold them once, as ``torch.save`` of the originals would."""
    memo = {} if _memo is None else _memo
    if torch.is_tensor(tree):
        key = (tree.device, tree.untyped_storage().data_ptr(), tree.storage_offset(), tuple(tree.shape),
               tuple(tree.stride()), tree.dtype)  # fmt: skip
        if key not in memo:
            memo[key] = tree.detach().to("cpu", copy=True)
        return memo[key]
    if isinstance(tree, dict):
        return type(tree)((k, host_copy(v, memo)) for k, v in tree.items())
    if isinstance(tree, (list, tuple)):
        return type(tree)(host_copy(v, memo) for v in tree)
    return copy.deepcopy(tree)


def write_pretrained(module: Any, state: dict[str, torch.Tensor], out_dir: str, model_dir: str, recipe: Any,
                     adapter: Any = None) -> str:
    """The policy in Hugging Face format under ``out_dir`` (written to ``out_dir.tmp``, then renamed): ``module``'s
    config with the weights ``state`` (safetensors), the tokenizer with the run's chat template
    (``data.chat_template_path``), ``torch_dtype`` the recipe's, the model folder's ``generation_config.json``;
    ``adapter``: a PEFT model whose adapter folder goes in ``out_dir/adapter``. Returns ``out_dir``."""
    from transformers import AutoTokenizer

    from rlvr.data.datasets import with_chat_template  # the run's template (data.chat_template_path) goes along

    tmp = Path(out_dir + ".tmp")
    module.save_pretrained(str(tmp), state_dict=state, safe_serialization=True)
    if adapter is not None:
        adapter.save_pretrained(str(tmp / "adapter"))
    with_chat_template(AutoTokenizer.from_pretrained(model_dir), recipe.data).save_pretrained(str(tmp))
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = cfg["dtype"] = recipe.model.dtype
    cfg_path.write_text(json.dumps(cfg, indent=2))
    gen = Path(model_dir) / "generation_config.json"
    if gen.exists():
        (tmp / "generation_config.json").write_text(gen.read_text())
    if Path(out_dir).exists():
        import shutil

        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir


class Writer:
    """Runs one checkpoint's writing (``job``) on a thread of its own; :meth:`wait` joins it."""

    def __init__(self, job: Callable[[], None], name: str) -> None:
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(job,), name=name, daemon=True)
        self._thread.start()

    def _run(self, job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as e:  # noqa: BLE001 - re-raised by wait(), in the caller's thread
            self.error = e

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the writing is done. Errors: what the writing raised; ``TimeoutError`` past ``timeout_s``."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"the checkpoint's writing ({self._thread.name}) did not end within {timeout_s} s")
        if self.error is not None:
            raise self.error
