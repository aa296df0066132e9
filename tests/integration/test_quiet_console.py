"""The quiet console through a real Ray (issue 14): an actor's known third-party noise reaches the driver's
log file and not its console; an unknown warning and an actor's traceback reach both; a known Python warning's
source line is dropped with it, a traceback frame after such a warning is not (issue 23). Guards the hook into
Ray's log forwarding (rlvr.console.route_role_output), a Ray internal. The raylet's de-duplication (periodic
messages once, worker deaths and OOM kills every time) needs a full disk or an OOM kill to happen for real: it
is tested on the raylet's real lines in tests/unit/test_console.py.

The same driver (one Ray start for both) runs from a working directory holding another ``rlvr`` package, as a
second clone does (issue 24): its actor must import the driver's rlvr and rlvr_verifiers (rlvr.runtime.codepath)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

DRIVER = r'''
import json, logging, sys, time, traceback
import rlvr, rlvr_verifiers
from rlvr.console import setup_console
from rlvr.runtime.executors import RayExecutor

setup_console(logging.INFO)
logging.getLogger().addHandler(logging.FileHandler(sys.argv[1]))

WARNED = ("/x/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: `torch.distributed.reduce_op` is "
          "deprecated, please use `torch.distributed.ReduceOp` instead")

class Talker:
    def talk(self):
        print("Triton is installed, but doesn't include CPU backend. Disabling Triton.", file=sys.stderr, flush=True)
        print("Loading weights: 100%|##########| 21/21 [00:00<00:00, 8937.63it/s]", file=sys.stderr, flush=True)
        print("WARNING some_library: a third-party warning nobody has seen", file=sys.stderr, flush=True)
        # a known Python warning and the source line under it (both dropped from the console) ...
        print(WARNED + "\n  if hasattr(value, '__dict__'):", file=sys.stderr, flush=True)
        # ... and one that another thread's traceback frame follows (the frame must show)
        print(WARNED + '\n  File "/work/rlvr/train/policy.py", line 12, in update', file=sys.stderr, flush=True)
        try:
            raise RuntimeError("the actor's own error")
        except RuntimeError:
            traceback.print_exc()
        print("talked", flush=True)

    def where(self):
        import rlvr, rlvr_verifiers
        return {"rlvr": rlvr.__file__, "rlvr_verifiers": rlvr_verifiers.__file__, "sys_path": sys.path}

ex = RayExecutor(None, 1, {})
t = ex.spawn("talker", Talker)
ex.get([t.call("talk")], 120, "talk")
with open(sys.argv[2], "w") as f:
    json.dump({"driver": {"rlvr": rlvr.__file__, "rlvr_verifiers": rlvr_verifiers.__file__},
               "actor": ex._ray.get(t._target.where.remote(), timeout=120)}, f)
deadline = time.time() + 30  # the actor's lines come through Ray's log monitor, a little after the calls
while time.time() < deadline and not all(x in open(sys.argv[1]).read() for x in ("talked", "own error", "Triton")):
    time.sleep(0.5)
ex.shutdown()
'''


DECOY = """# a second clone's rlvr: its own __init__, the real package's modules under it
__path__.append({real!r})
"""


@pytest.fixture(scope="module")
def driven(tmp_path_factory):
    """Run :data:`DRIVER` once: from ``clone/`` (the working directory, holding a decoy ``rlvr`` package), the
    script in ``driver/``, the real rlvr on PYTHONPATH. Returns (console text, train.log text, where.json)."""
    tmp = tmp_path_factory.mktemp("quiet_console")
    (tmp / "driver").mkdir()
    (tmp / "clone" / "rlvr").mkdir(parents=True)
    script = tmp / "driver" / "drive.py"
    script.write_text(DRIVER)
    import rlvr

    (tmp / "clone" / "rlvr" / "__init__.py").write_text(DECOY.format(real=str(Path(rlvr.__file__).parent)))
    log, where = tmp / "train.log", tmp / "where.json"
    path = [str(REPO), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), RLVR_CONSOLE="quiet")
    p = subprocess.run([sys.executable, str(script), str(log), str(where)], cwd=tmp / "clone", env=env,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    console = p.stdout + p.stderr
    assert p.returncode == 0, console[-4000:]
    return console, log.read_text(), json.loads(where.read_text()), tmp / "clone"


@pytest.mark.integration
def test_an_actors_known_noise_goes_to_the_log_file_only(driven):
    console, logged, _, _ = driven
    assert "(Talker pid=" in console and "WARNING some_library: a third-party warning nobody has seen" in console
    assert "talked" in console and "Traceback (most recent call last):" in console
    assert "in talk" in console and "RuntimeError: the actor's own error" in console
    assert "Triton is installed" not in console and "Loading weights" not in console
    # the rule that drops a known warning's source line: the source line goes, a traceback frame never does
    assert "reduce_op" not in console and "if hasattr(value, '__dict__'):" not in console
    assert 'File "/work/rlvr/train/policy.py", line 12, in update' in console
    for line in ("Triton is installed, but doesn't include CPU backend", "Loading weights: 100%",
                 "WARNING some_library: a third-party warning nobody has seen", "RuntimeError: the actor's own error",
                 "talked"):  # fmt: skip
        assert "(Talker pid=" in logged and f") {line}" in logged, line


@pytest.mark.integration
def test_an_actor_imports_the_drivers_rlvr_not_the_working_directorys(driven):
    """Before issue 24 the actor's rlvr was clone/rlvr/__init__.py (Ray puts the driver's working directory first
    on the workers' sys.path). Its sys.path must also find the driver's rlvr first, for the processes it starts."""
    _, _, where, clone = driven
    assert where["actor"]["rlvr"] == where["driver"]["rlvr"] != str(clone / "rlvr" / "__init__.py")
    assert where["actor"]["rlvr_verifiers"] == where["driver"]["rlvr_verifiers"]
    path = where["actor"]["sys_path"]
    root = str(Path(where["driver"]["rlvr"]).parent.parent)
    assert str(clone) in path and path.index(root) < path.index(str(clone)), path[:6]
