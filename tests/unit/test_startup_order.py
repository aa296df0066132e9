"""Start-up order on a shared GPU (issue 27, rlvr.runtime.roles.shares_devices): vLLM sizes its KV cache from the
free GPU memory it measures while it starts (``gpu_memory_utilization``), so where the engines share a GPU with the
trainer (fractions of one, or every role in one process) each engine, then the judge, then the teacher (on-policy
distillation) has finished construction before the next role is created, the trainer last. Fakes
(tests/unit/loop_fakes.py) record each role's spawn and the end of its construction; their constructors run in
parallel threads, as Ray actors do."""

from __future__ import annotations

import time
from pathlib import Path

from loop_fakes import FakeExecutor

from rlvr.models import resolve_model
from rlvr.recipe import load_recipe
from rlvr.runtime.roles import Roles, shares_devices

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")
JUDGE = ["reward.verifiers=[{name: numeric}, {name: judge, weight: 0.0, args: {parse: boxed_step}}]",
         "judge.model=tiny-random"]  # fmt: skip
DISTILL = ["algorithm.advantage=distill", "teacher.model=tiny-random", "rollout.samples_per_prompt=2"]
"""On-policy distillation: a teacher role (a vLLM engine of its own, rlvr.rollout.teacher) on teacher.model."""
BUILD_S = 0.3
"""How long a fake engine, judge or teacher takes to build (vLLM measuring the GPU): long enough that a role created
without waiting for it is created first."""


class ParallelExecutor(FakeExecutor):
    """The fake roles, each built on its own thread with no build lock (as Ray actors start in parallel); the log
    gets ``(role, "spawn")`` when a role is created and ``(role, "built")`` when its constructor returned."""

    def spawn(self, name, cls, *args, resources=None, **kwargs):
        self.log.add(name, "spawn")
        return super().spawn(name, cls, *args, resources=resources, **kwargs)

    def _construct(self, cls, args, kwargs):
        role = kwargs["role"]
        if role.startswith("engine") or role in ("judge", "teacher"):
            time.sleep(BUILD_S)
        obj = cls(*args, **kwargs)
        self.log.add(role, "built")
        return obj


def _start_events(tmp_path, *overrides) -> list[tuple[str, str]]:
    r = load_recipe(TINY, [f"run.output_dir={tmp_path}", "sync.probe_every=0", "rollout.num_engines=2", *overrides])
    ex = ParallelExecutor()
    roles = Roles(r, resolve_model("tiny-random"), tmp_path, ex)
    roles.shutdown()
    return [c for c in ex.log.calls if c[1] in ("spawn", "built", "setup")]


def test_on_a_shared_gpu_each_engine_and_the_judge_are_built_before_the_next_role(tmp_path):
    """The GPU recipe's layout (engines 0.4, trainer 0.5 of a GPU) with two engines and a judge."""
    events = _start_events(tmp_path, "rollout.num_gpus=0.4", "trainer.num_gpus=0.5", *JUDGE)
    assert events[:6] == [("engine0", "spawn"), ("engine0", "built"), ("engine1", "spawn"), ("engine1", "built"),
                          ("judge", "spawn"), ("judge", "built")]  # fmt: skip
    assert ("trainer0", "spawn") in events[6:] and events[-1] == ("trainer0", "setup")
    # every role in one process (the local executor): the same order, whatever num_gpus says
    events = _start_events(tmp_path / "local", "run.executor=local", "rollout.engine=hf")
    assert events[:4] == [("engine0", "spawn"), ("engine0", "built"), ("engine1", "spawn"), ("engine1", "built")]


def test_on_a_shared_gpu_the_teacher_is_built_before_the_next_role(tmp_path):
    """The teacher is a vLLM engine too (it sizes its KV cache from the free memory it measures): on a shared GPU
    it is built after the engines and the judge and before the reward worker and the trainer are created."""
    events = _start_events(tmp_path, "rollout.num_gpus=0.4", "trainer.num_gpus=0.3", "teacher.num_gpus=0.2",
                           "rollout.gpu_memory_utilization=0.3", *DISTILL, *JUDGE)  # fmt: skip
    assert events[:8] == [("engine0", "spawn"), ("engine0", "built"), ("engine1", "spawn"), ("engine1", "built"),
                          ("judge", "spawn"), ("judge", "built"), ("teacher", "spawn"), ("teacher", "built")]
    assert ("reward", "spawn") in events[8:] and ("trainer0", "spawn") in events[8:]
    # the teacher's fraction alone makes the GPU shared (engines and trainer on whole GPUs): the same wait
    events = _start_events(tmp_path / "teacher", "rollout.num_gpus=1", "trainer.num_gpus=1", "teacher.num_gpus=0.5",
                           *DISTILL)  # fmt: skip
    assert events[:6] == [("engine0", "spawn"), ("engine0", "built"), ("engine1", "spawn"), ("engine1", "built"),
                          ("teacher", "spawn"), ("teacher", "built")]  # fmt: skip
    # on CPU nothing waits: the trainer is created while the teacher is still building
    events = _start_events(tmp_path / "cpu", *DISTILL)
    assert events.index(("trainer0", "spawn")) < events.index(("teacher", "built"))


def test_on_whole_gpus_or_cpu_the_roles_start_side_by_side(tmp_path):
    """No shared device: nothing waits, the trainer is created while the engines are still building (as before:
    on CPU their starts overlap)."""
    events = _start_events(tmp_path)
    assert events.index(("trainer0", "spawn")) < events.index(("engine0", "built"))
    events = _start_events(tmp_path / "gpus", "rollout.num_gpus=1", "trainer.num_gpus=1")
    assert events.index(("trainer0", "spawn")) < events.index(("engine0", "built"))


def test_which_layouts_share_a_device():
    def shared(*overrides):
        return shares_devices(load_recipe(TINY, list(overrides)))

    assert not shared() and not shared("rollout.num_gpus=1", "trainer.num_gpus=1")
    assert shared("rollout.num_gpus=0.4", "trainer.num_gpus=0.5")
    assert shared("rollout.num_gpus=1", "trainer.num_gpus=0.5")  # a fraction anywhere may share
    assert shared("rollout.num_gpus=1", "trainer.num_gpus=1", "algorithm.advantage=gae", "critic.num_gpus=0.5")
    assert not shared("critic.num_gpus=0.5")  # no critic in this recipe (grpo): its setting is unused
    assert shared(*JUDGE, "judge.num_gpus=0.3")
    assert shared(*DISTILL, "rollout.num_gpus=1", "trainer.num_gpus=1", "teacher.num_gpus=0.5")
    assert not shared("teacher.num_gpus=0.5")  # no teacher in this recipe (grpo): its setting is unused
    assert shared("run.executor=local")  # one process, one device
