"""Placement-group reservation says what it waits for (issue 23, "Start-up and clean-up"), without a Ray cluster:
the fit decision against the nodes' totals (an error naming the bundle, what it asks, the free resources and the
recipe keys to change) and against what is free now (a warning naming what holds the resources), the periodic
waiting line, and :meth:`RayExecutor.reserve`'s wait loop driven by a fake ``ray``."""

from __future__ import annotations

import logging
import sys
import time

import pytest

import rlvr.runtime.executors as executors
from rlvr.runtime.executors import Group, RayExecutor, RoleError, reserve_problems, shown_resources, waiting_message

TRAINER = Group("trainer", ({"CPU": 0.1, "GPU": 1.0}, {"CPU": 0.1, "GPU": 1.0}), "PACK",
                "trainer.num_workers, trainer.num_gpus, trainer.resources")  # fmt: skip
ENGINES = Group("engines", ({"CPU": 0.1, "GPU": 1.0},), "PACK", "rollout.num_engines, rollout.num_gpus")
REWARD = Group("reward", ({"CPU": 0.1},), "PACK", "reward.resources")


def test_shown_resources_leave_out_ray_bookkeeping():
    seen = {"GPU": 1.0, "CPU": 0.3, "CPU_group_5be7fc4a": 1.5, "CPU_group_0_5be7fc4a": 1.5, "node:192.0.2.2": 1.0,
            "node:__internal_head__": 1.0, "memory": 1.2e10, "object_store_memory": 5.2e9, "bundle_group_5be7": 1000.0}
    assert shown_resources(seen) == "{CPU 0.3, GPU 1}"


def test_more_than_the_cluster_has_names_the_bundle_the_free_resources_and_the_keys():
    totals = {"A": {"CPU": 2.0, "GPU": 1.0}}
    free = {"A": {"CPU": 1.5, "GPU": 1.0}}
    error, warning = reserve_problems([TRAINER, REWARD], totals, free, ["placement group 1a2b3c4d (CREATED: {CPU 0.5})"])
    assert warning is None
    assert error == (
        "the recipe asks for more than the Ray cluster has: trainer[1] needs {CPU 0.1, GPU 1} on one node. "
        "The cluster's nodes: A: {CPU 2, GPU 1}; free now: A: {CPU 1.5, GPU 1}. Fix: lower the recipe keys that size "
        "them (trainer: trainer.num_workers, trainer.num_gpus, trainer.resources), add nodes, or start nodes with "
        "the custom resources the recipe names (ray start --resources)"
    )


def test_what_fits_the_cluster_but_not_what_is_free_is_a_warning_naming_the_holders():
    totals = {"A": {"CPU": 2.0, "GPU": 1.0}}
    free = {"A": {"CPU": 1.9, "GPU": 0.0}}  # another job's placement group holds the GPU
    holders = ["placement group 1a2b3c4d 'other' (CREATED: {GPU 1})", "actor Sampler (job 02000000)"]
    error, warning = reserve_problems([ENGINES, REWARD], totals, free, holders)
    assert error is None
    assert warning == (
        "the placement groups fit the cluster but not what is free now: engines[0] needs {CPU 0.1, GPU 1} on one "
        "node. Free now: A: {CPU 1.9, GPU 0}. Held by: placement group 1a2b3c4d 'other' (CREATED: {GPU 1}); actor "
        "Sampler (job 02000000). Waiting for them to be released"
    )
    assert reserve_problems([ENGINES, REWARD], totals, {"A": {"CPU": 0.2, "GPU": 1.0}}, []) == (None, None)


def test_the_waiting_line_names_each_pending_group_and_what_is_free():
    line = waiting_message(61.4, [ENGINES, REWARD], {"A": {"CPU": 0.05, "GPU": 0.0}}, [], 1800.0,
                           "timeouts.startup_s")  # fmt: skip
    assert line == (
        "waiting 61s (of at most 1800s, timeouts.startup_s) for placement groups: engines (1 x {CPU 0.1, GPU 1}); "
        "reward (1 x {CPU 0.1}). Free now: A: {CPU 0.05, GPU 0}. Held by: nothing rlvr can name (`ray status` "
        "shows the cluster)"
    )


class _PG:
    def __init__(self, name):
        self.name, self.ref = name, f"ready:{name}"

    def ready(self):
        return self.ref


class _FakeRay:
    """``ray.wait`` that holds each group back for its given number of waits (None: forever)."""

    def __init__(self, holds):
        self.holds, self.waits = dict(holds), 0

    def wait(self, refs, num_returns, timeout):
        self.waits += 1
        time.sleep(min(timeout, 0.01))
        ready = []
        for ref in refs:
            name = ref.split(":", 1)[1]
            if self.holds[name] is not None and self.holds[name] <= 0:
                ready.append(ref)
            elif self.holds[name] is not None:
                self.holds[name] -= 1
        return ready, [r for r in refs if r not in ready]


def _executor(monkeypatch, holds, free):
    import ray.util.placement_group  # noqa: F401 - the module (ray.util's attribute of that name is the function)

    rpg = sys.modules["ray.util.placement_group"]
    removed = []
    monkeypatch.setattr(rpg, "placement_group", lambda bundles, strategy, name: _PG(_names.pop(0)))
    monkeypatch.setattr(rpg, "remove_placement_group", lambda pg: removed.append(pg.name))
    monkeypatch.setattr(executors, "RESERVE_LOG_EVERY_S", 0.01)
    _names = ["engines", "reward"]
    ex = RayExecutor.__new__(RayExecutor)
    ex._ray, ex._groups, ex._actors = _FakeRay(holds), {}, []
    ex.nodes = lambda: {"A": {"CPU": 2.0, "GPU": 1.0}}
    ex.free_resources = lambda: free
    ex.holders = lambda: ["actor Sampler (job 02000000)"]
    return ex, removed


def test_reserve_logs_what_it_waits_for_until_placed(monkeypatch, caplog):
    ex, removed = _executor(monkeypatch, {"engines": 2, "reward": 0}, {"A": {"CPU": 1.9, "GPU": 0.0}})
    with caplog.at_level(logging.INFO, logger="rlvr.runtime.executors"):
        ex.reserve([ENGINES, REWARD], 60.0, "timeouts.startup_s")
    lines = [r.getMessage() for r in caplog.records]
    assert sum("the placement groups fit the cluster but not what is free now" in ln for ln in lines) == 1
    waiting = [ln for ln in lines if ln.startswith("waiting ")]
    # engines is held for two waits: two lines, each naming only engines (reward was placed at the first wait)
    assert len(waiting) == 2 and ex._ray.waits == 3
    assert all("placement groups: engines (1 x {CPU 0.1, GPU 1}). Free now: A: {CPU 1.9, GPU 0}" in ln for ln in waiting)
    assert all("Held by: actor Sampler (job 02000000)" in ln for ln in waiting)
    assert removed == [] and set(ex._groups) == {"engines", "reward"}


def test_reserve_gives_up_at_the_deadline_and_removes_its_groups(monkeypatch):
    ex, removed = _executor(monkeypatch, {"engines": None, "reward": 0}, {"A": {"CPU": 2.0, "GPU": 1.0}})
    with pytest.raises(RoleError, match=r"reserving the placement group 'engines'.*raise timeouts.startup_s"):
        ex.reserve([ENGINES, REWARD], 0.1, "timeouts.startup_s")
    assert removed == ["engines", "reward"] and ex._groups == {}


def test_reserve_refuses_what_the_cluster_cannot_hold_before_reserving(monkeypatch):
    ex, removed = _executor(monkeypatch, {"engines": 0, "reward": 0}, {"A": {"CPU": 2.0, "GPU": 1.0}})
    with pytest.raises(RoleError, match=r"trainer\[1\] needs \{CPU 0.1, GPU 1\}.*trainer.num_workers"):
        ex.reserve([TRAINER], 60.0, "timeouts.startup_s")
    assert ex._groups == {} and ex._ray.waits == 0
