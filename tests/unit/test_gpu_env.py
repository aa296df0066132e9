"""What each role's process sees of the GPUs and of the communication settings (issue 27): a Ray actor that asks
for no GPU starts with ``CUDA_VISIBLE_DEVICES=""`` (recent Ray leaves it unset, and the actor sees every GPU), a GPU
role's is left to Ray; the NCCL / gloo settings of the launcher reach every role alike, and launch/submit.sh
carries the same names into a Ray job."""

from __future__ import annotations

import re
from pathlib import Path

from rlvr.environ import COMM_ENV, comm_env
from rlvr.recipe import load_recipe
from rlvr.runtime.executors import RayExecutor, Resources, actor_env
from rlvr.runtime.roles import role_env, role_resources

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny_test.yaml"


def test_a_zero_gpu_actor_sees_no_gpu_and_a_gpu_actors_devices_are_rays():
    assert actor_env(Resources(num_gpus=0, env={"A": "1"})) == {"A": "1", "CUDA_VISIBLE_DEVICES": ""}
    assert actor_env(Resources(num_gpus=1, env={"A": "1"})) == {"A": "1"}
    assert actor_env(Resources(num_gpus=0.4)) == {}
    # a zero-GPU role's own value is overridden: it holds no GPU, whatever the launcher's shell had
    assert actor_env(Resources(num_gpus=0, env={"CUDA_VISIBLE_DEVICES": "0,1"}))["CUDA_VISIBLE_DEVICES"] == ""


class _FakeRay:
    """``ray.remote(cls).options(**kw).remote(...)``: records the options of each actor."""

    def __init__(self) -> None:
        self.options: list[dict] = []

    def remote(self, cls):
        fake = self

        class _Cls:
            def options(self, **kw):
                fake.options.append(kw)
                return self

            def remote(self, *a, **k):
                return object()

        return _Cls()


def test_ray_spawn_passes_each_role_its_env(monkeypatch, tmp_path):
    """The recipe's roles through RayExecutor.spawn (Ray faked): the critic and the reward worker at 0 GPUs beside
    a GPU trainer and GPU engines get CUDA_VISIBLE_DEVICES=""; the trainer and engines get none of rlvr's."""
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth7")
    r = load_recipe(TINY, ["trainer.num_gpus=1", "rollout.num_gpus=1", "algorithm.advantage=gae"])
    res = role_resources(r, role_env(r, tmp_path, 1))
    ex = RayExecutor.__new__(RayExecutor)
    ex._ray, ex._groups, ex._actors = _FakeRay(), {}, []
    names = ["trainer", "engines", "reward", "critic"]
    for name in names:
        ex.spawn(name, object, resources=res[name][0])
    envs = {n: o["runtime_env"]["env_vars"] for n, o in zip(names, ex._ray.options)}
    gpus = {n: o["num_gpus"] for n, o in zip(names, ex._ray.options)}
    assert gpus == {"trainer": 1, "engines": 1, "reward": 0, "critic": 0}
    assert {n: e.get("CUDA_VISIBLE_DEVICES") for n, e in envs.items()} == {
        "trainer": None, "engines": None, "reward": "", "critic": ""}
    assert {e["NCCL_SOCKET_IFNAME"] for e in envs.values()} == {"eth7"}  # one value on both sides of the sync


def test_the_launchers_nccl_settings_reach_every_role(monkeypatch, tmp_path):
    for k in COMM_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    monkeypatch.setenv("NCCL_NOT_LISTED", "x")  # only the listed names travel
    assert comm_env() == {"NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1"}
    assert comm_env({"GLOO_SOCKET_IFNAME": "ib0", "PATH": "/bin"}) == {"GLOO_SOCKET_IFNAME": "ib0"}
    r = load_recipe(TINY, ["trainer.num_gpus=1", "rollout.num_gpus=1", "algorithm.advantage=gae"])
    res = role_resources(r, role_env(r, tmp_path, 1))
    for group, items in res.items():
        for x in items:
            assert (x.env["NCCL_IB_DISABLE"], x.env["NCCL_P2P_DISABLE"]) == ("1", "1"), group
            assert "NCCL_NOT_LISTED" not in x.env


def test_submit_sh_carries_the_same_names_into_a_ray_job():
    text = (ROOT / "launch" / "submit.sh").read_text()
    block = re.search(r"^PASS_ENV=\((.*?)^\)", text, re.S | re.M).group(1)
    names = set(re.sub(r"#[^\n]*", "", block).split())
    assert set(COMM_ENV) <= names, set(COMM_ENV) - names
    readme = (ROOT / "launch" / "README.md").read_text()
    assert all(f"`{k}`" in readme for k in COMM_ENV)
