"""Placement: what each role asks of the cluster (from the recipe), and the fit check that refuses a recipe the
cluster cannot hold before anything starts (cases worked by hand)."""

from __future__ import annotations

from pathlib import Path

from rlvr.recipe import load_recipe
from rlvr.runtime.executors import Group, fit_bundles
from rlvr.runtime.roles import placement_groups, role_resources
from rlvr.rollout.vllm_engine import cpu_bind

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")


def test_largest_bundles_go_first_and_what_has_no_room_is_named():
    nodes = {"A": {"CPU": 2.0, "GPU": 2.0}, "B": {"CPU": 2.0, "GPU": 1.0}}
    groups = [Group("trainer", ({"CPU": 0.1, "GPU": 1.0}, {"CPU": 0.1, "GPU": 1.0})),
              Group("engines", ({"CPU": 0.2, "GPU": 2.0},))]  # fmt: skip
    # engines[0] (2 GPUs) takes A whole; trainer[0] takes B's one GPU; trainer[1] finds no GPU left
    assert fit_bundles(groups, nodes) == ["trainer[1] needs {CPU 0.1, GPU 1} on one node"]
    assert fit_bundles(groups, {**nodes, "C": {"CPU": 1.0, "GPU": 1.0}}) == []


def test_a_bundle_larger_than_any_node_and_custom_resources():
    nodes = {"A": {"CPU": 8.0, "GPU": 1.0}, "B": {"CPU": 8.0, "GPU": 1.0, "gen": 1.0}}
    # 2 GPUs in total, but no node holds an engine of 2
    assert fit_bundles([Group("engines", ({"CPU": 0.2, "GPU": 2.0},))], nodes) == [
        "engines[0] needs {CPU 0.2, GPU 2} on one node"]
    # a custom resource only B has: the first engine fits there, the second does not
    two = Group("engines", ({"CPU": 0.1, "gen": 1.0}, {"CPU": 0.1, "gen": 1.0}))
    assert fit_bundles([two], nodes) == ["engines[1] needs {CPU 0.1, gen 1} on one node"]
    # STRICT_PACK: the group's sum on one node (0.6 + 0.6 GPUs > 1)
    strict = Group("x", ({"CPU": 0.1, "GPU": 0.6}, {"CPU": 0.1, "GPU": 0.6}), "STRICT_PACK")
    assert fit_bundles([strict], nodes) == ["x (all 2 on one node) needs {CPU 0.2, GPU 1.2} on one node"]


def test_role_resources_follow_the_recipe():
    r = load_recipe(TINY, ["trainer.num_workers=2", "trainer.num_gpus=1", "trainer.backend=deepspeed",
                           "trainer.resources={train_node: 1}", "rollout.num_engines=2",
                           "rollout.tensor_parallel_size=2", "rollout.num_gpus=1"])  # fmt: skip
    res = role_resources(r, {})
    assert sorted(res) == ["engines", "reward", "trainer"]  # grpo: no critic
    assert [x.bundle_dict() for x in res["trainer"]] == [{"CPU": 0.1, "GPU": 1.0, "train_node": 1}] * 2
    assert [x.bundle for x in res["trainer"]] == [0, 1] and res["trainer"][0].group == "trainer"
    assert [x.bundle_dict() for x in res["engines"]] == [{"CPU": 0.2, "GPU": 2.0}] * 2  # TP 2 x 1 GPU each
    assert res["reward"][0].bundle_dict() == {"CPU": 0.1}
    assert [g.name for g in placement_groups(res)] == ["trainer", "engines", "reward"]
    assert "critic" in role_resources(load_recipe(TINY, ["algorithm.advantage=gae"]), {})


def test_cpu_bind_gives_each_tp_worker_its_own_cores():
    assert cpu_bind(2, 1, [0, 1]) == "0|1"
    assert cpu_bind(2, 2, [0, 1, 2, 3]) == "0,1|2,3"
    assert cpu_bind(4, 1, [4, 5]) == "4|5|4|5"  # fewer cores than workers: wraps round
