"""Start-up on a real Ray (issue 23). A role that fails to start leaves no Ray actor and no placement group
behind: the real :class:`rlvr.runtime.roles.Roles` on the real :class:`rlvr.runtime.executors.RayExecutor`, on a
Ray the driver started itself (so that it can be asked afterwards), with stand-in role classes (milliseconds to
start instead of a vLLM engine) whose trainer rank raises in ``setup`` after the engine and the reward role are
up. A reservation that must wait for another job's placement group says so, naming it and what is free (Ray's
per-node free resources and placement-group table, read through internal APIs that a Ray upgrade may move)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

DRIVER = r'''
import json, sys, time
import ray
from ray.util import placement_group_table
from rlvr.models import resolve_model
from rlvr.recipe import load_recipe
from rlvr.runtime.executors import RayExecutor, RoleError
from rlvr.runtime.roles import Roles

class Engine:
    def __init__(self, *a, **k): pass
    def ping(self): return True

class Reward:
    def __init__(self, *a, **k): pass
    def close(self): return True
    def ping(self): return True

class Trainer:
    def __init__(self, *a, **k): pass
    def rendezvous_address(self): return "127.0.0.1", 0
    def setup(self, host, port): raise RuntimeError("no room for the optimizer state")
    def ping(self): return True

class StandIns(RayExecutor):
    def spawn(self, name, cls, *args, resources=None, **kwargs):
        stand_in = Engine if name.startswith("engine") else Reward if name == "reward" else Trainer
        return super().spawn(name, stand_in, resources=resources)

ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)
r = load_recipe(sys.argv[1], ["run.executor=ray", "rollout.num_engines=2", f"run.output_dir={sys.argv[2]}"])
ex = StandIns(None, None, {})
try:
    Roles(r, resolve_model(r.model.path), sys.argv[2], ex)
    error = None
except RoleError as e:
    error = str(e)
time.sleep(1.0)
groups = placement_group_table()
actors = [a for a in ray._private.state.actors().values() if a["State"] != "DEAD"]
print("RESULT " + json.dumps({"error": error, "groups": sorted(g["state"] for g in groups.values()),
                              "alive_actors": [a["ActorClassName"] for a in actors]}))
ray.shutdown()
'''


@pytest.mark.integration
def test_a_role_that_fails_in_setup_leaves_no_actor_or_placement_group(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    recipe = REPO / "recipes" / "tiny_test.yaml"
    p = subprocess.run([sys.executable, "-c", DRIVER, str(recipe), str(tmp_path)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    result = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT ") :])
    assert "trainer0.setup failed: RuntimeError: no room for the optimizer state" in result["error"]
    # three groups were reserved (trainer, engines, reward) and four actors started; all are gone
    assert result["groups"] == ["REMOVED", "REMOVED", "REMOVED"], result
    assert result["alive_actors"] == [], result


WAITER = r'''
import logging, sys, threading, time
import ray
from ray.util.placement_group import placement_group, remove_placement_group
import rlvr.runtime.executors as executors
from rlvr.runtime.executors import Group, RayExecutor

logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="LOG %(levelname)s %(message)s")
ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)
other = placement_group([{"CPU": 1.95}], name="other-job")
ray.get(other.ready())
executors.RESERVE_LOG_EVERY_S = 1.0
ex = RayExecutor(None, None, {})
threading.Timer(3.5, lambda: remove_placement_group(other)).start()
t0 = time.monotonic()
ex.reserve([Group("engines", ({"CPU": 0.1},), "PACK", "rollout.num_engines")], 60, "timeouts.startup_s")
print(f"PLACED after {time.monotonic() - t0:.1f}s")
ex.shutdown()
ray.shutdown()
'''


@pytest.mark.integration
def test_a_reservation_that_waits_for_another_jobs_group_says_what_holds_the_resources(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", WAITER], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    logs = [ln for ln in p.stdout.splitlines() if ln.startswith("LOG ")]
    warning = [ln for ln in logs if "fit the cluster but not what is free now" in ln]
    # 2 CPUs, 1.95 held by the other job's group: 0.05 free, 0.1 asked
    assert len(warning) == 1 and "engines[0] needs {CPU 0.1} on one node" in warning[0], logs
    assert "{CPU 0.05}" in warning[0] and "'other-job' (CREATED: {CPU 1.95})" in warning[0], warning
    waiting = [ln for ln in logs if "for placement groups: engines (1 x {CPU 0.1})" in ln]
    # one a second; those logged while the other job held its group (released at 3.5 s) name it. A line logged
    # after the release but before the placement lands ("waiting 4s") rightly names nothing.
    held = [ln for ln in waiting if int(re.search(r"waiting (\d+)s", ln).group(1)) <= 3]
    assert len(held) >= 2 and all("'other-job'" in ln for ln in held), logs
    assert "PLACED after" in p.stdout
