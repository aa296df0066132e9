"""GPU settings refused at load (issue 27, rlvr.recipe.gpu_errors), each naming the recipe key and the fix: a weight
sync over NCCL where its ranks share a GPU or one has none, and tensor-parallel workers sharing a GPU. Recipes are
written as YAML here, so each case shows the settings a user would have written."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.config import RecipeError
from rlvr.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]


def _problems(tmp_path: Path, text: str) -> list[str]:
    """The problems :func:`load_recipe` lists for the recipe ``text`` (empty: it loads)."""
    path = tmp_path / "r.yaml"
    path.write_text(text)
    try:
        load_recipe(path)
    except RecipeError as e:
        head, *lines = str(e).split("\n  - ")
        assert head == "invalid recipe:"
        return lines
    return []


DUP = 'NCCL refuses two ranks on one GPU ("Duplicate GPU detected")'


def test_nccl_on_a_shared_gpu_is_refused_naming_gloo(tmp_path):
    """The GPU recipe's layout (engine 0.4 and trainer 0.5 of one GPU) with sync.backend: nccl."""
    got = _problems(tmp_path, "trainer: {num_gpus: 0.5}\nrollout: {num_gpus: 0.4}\nsync: {backend: nccl}\n")
    assert got == [f"sync.backend=nccl with trainer.num_gpus=0.5 and rollout.num_gpus=0.4: a fraction of a GPU shares "
                   f"the device with another role, and {DUP}: set sync.backend: gloo (or auto, which picks gloo "
                   "there), or give trainer and rollout whole GPUs (num_gpus >= 1)"]
    # one side fractional is enough
    got = _problems(tmp_path, "trainer: {num_gpus: 1}\nrollout: {num_gpus: 0.5}\nsync: {backend: nccl}\n")
    assert got[0].startswith("sync.backend=nccl with rollout.num_gpus=0.5: a fraction of a GPU")
    # the same layout with gloo or auto loads
    assert _problems(tmp_path, "trainer: {num_gpus: 0.5}\nrollout: {num_gpus: 0.4}\nsync: {backend: gloo}\n") == []
    assert _problems(tmp_path, "trainer: {num_gpus: 0.5}\nrollout: {num_gpus: 0.4}\n") == []


def test_nccl_with_the_local_executor_is_refused(tmp_path):
    """Every role in one process, whatever num_gpus says (the local executor ignores it)."""
    got = _problems(tmp_path, "run: {executor: local}\ntrainer: {num_gpus: 1}\nrollout: {num_gpus: 1}\n"
                              "sync: {backend: nccl}\n")
    assert got == [f"sync.backend=nccl with run.executor=local: every role runs in this one process, on one GPU, and "
                   f"{DUP}: set sync.backend: gloo (or auto, which picks gloo there)"]


def test_nccl_with_a_side_on_cpu_is_refused(tmp_path):
    got = _problems(tmp_path, "trainer: {num_gpus: 1}\nsync: {backend: nccl}\n")  # rollout.num_gpus: 0 (default)
    assert got == ["sync.backend=nccl with rollout.num_gpus=0: NCCL needs a GPU at every rank of the weight sync, "
                   "and that role runs on CPU: set sync.backend: gloo (or auto, which picks gloo there), or give "
                   "trainer and rollout whole GPUs (num_gpus >= 1)"]
    got = _problems(tmp_path, "sync: {backend: nccl}\n")
    assert got[0].startswith("sync.backend=nccl with trainer.num_gpus=0 and rollout.num_gpus=0: NCCL needs")


def test_nccl_on_whole_gpus_loads(tmp_path):
    assert _problems(tmp_path, "trainer: {num_gpus: 1}\nrollout: {num_gpus: 1}\nsync: {backend: nccl}\n") == []


def test_tensor_parallel_workers_sharing_a_gpu_are_refused(tmp_path):
    """rollout.num_gpus is per engine worker: 2 workers x 0.5 = 1 GPU for 2 workers; 4 x 0.5 = 2 GPUs for 4."""
    got = _problems(tmp_path, "rollout: {tensor_parallel_size: 2, num_gpus: 0.5}\n")
    assert got == ["rollout.tensor_parallel_size=2 with rollout.num_gpus=0.5: num_gpus is per engine worker, so each "
                   "engine would hold 2 x 0.5 = 1 GPUs for its 2 tensor-parallel workers, and vLLM needs a GPU per "
                   "worker: set rollout.num_gpus: 1, or rollout.tensor_parallel_size: 1"]
    got = _problems(tmp_path, "rollout: {tensor_parallel_size: 4, num_gpus: 0.5}\n")
    assert got[0].startswith("rollout.tensor_parallel_size=4 with rollout.num_gpus=0.5: num_gpus is per engine "
                             "worker, so each engine would hold 4 x 0.5 = 2 GPUs for its 4 ")
    # a GPU per worker, or CPU workers (num_gpus 0), load
    assert _problems(tmp_path, "rollout: {tensor_parallel_size: 2, num_gpus: 1}\n") == []
    assert _problems(tmp_path, "rollout: {tensor_parallel_size: 2}\n") == []


def test_the_shipped_gpu_recipe_loads():
    r = load_recipe(ROOT / "recipes" / "gsm8k_qwen2.5_0.5b_gpu.yaml")
    assert (r.sync.backend, r.trainer.num_gpus, r.rollout.num_gpus) == ("gloo", 0.5, 0.4)


def test_the_shipped_gpu_recipe_refuses_nccl():
    with pytest.raises(RecipeError, match="sync.backend=nccl with trainer.num_gpus=0.5 and rollout.num_gpus=0.4"):
        load_recipe(ROOT / "recipes" / "gsm8k_qwen2.5_0.5b_gpu.yaml", ["sync.backend=nccl"])
