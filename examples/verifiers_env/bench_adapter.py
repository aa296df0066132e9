"""Per-call cost (ms) of rlvr.envs.verifiers_env vs a plain rlvr environment (builtins Guess), through
rlvr.envs.runner.env_reset/env_step (pickle in and out, as a worker does), one process, warm caches (the repository
root first on sys.path: the adapter's import of the verifiers distribution past rlvr's own verifiers/ folder runs).
Run: flock /tmp/rlvr_cpu.lock .venv/bin/python examples/verifiers_env/bench_adapter.py (docs/environments.md, verifiers)."""
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from rlvr.envs.runner import env_reset, env_step
from rlvr.envs.verifiers_env import VerifiersEnv
E = str(ROOT / "examples/verifiers_env/rlvr_vf_arith.py")
N = 200
rows = VerifiersEnv.rows(size=N, seed=1, taskset=E, taskset_args={"size": 1000})
trows = VerifiersEnv.rows(size=N, seed=1, taskset=E, taskset_args={"size": 1000, "task": {"tools": True}})
NAME = "rlvr.envs.verifiers_env:VerifiersEnv"
def timeit(fn):
    t = time.perf_counter(); r = fn(); return r, (time.perf_counter() - t) * 1e3
res = {"vf reset": [], "vf step 1 (follow-up)": [], "vf step 2 (final)": [], "vf tool step": [],
       "guess reset": [], "guess step": []}
for row, trow in zip(rows, trows):
    i = row["vf_task"]["info"]; s = i["a"] + i["b"]
    (st, op), t = timeit(lambda: env_reset(NAME, {"taskset": E, "taskset_args": {"size": 1000}, "max_turns": 2}, row)); res["vf reset"].append(t)
    (st, r1), t = timeit(lambda: env_step(st, op, {"role": "assistant", "content": str(s)})); res["vf step 1 (follow-up)"].append(t)
    (st, r2), t = timeit(lambda: env_step(st, op, {"role": "assistant", "content": str(s * i["c"])})); res["vf step 2 (final)"].append(t)
    assert r2.reward == 1.0 and r2.done
    targs = {"taskset": E, "taskset_args": {"size": 1000, "task": {"tools": True}}}
    (st, op), _ = timeit(lambda: env_reset(NAME, targs, trow))
    (st, r), t = timeit(lambda: env_step(st, op, {"role": "assistant", "content": '<tool_call>{"name": "calculator_multiply", "arguments": {"x": 6, "y": 7}}</tool_call>'}))
    assert r.messages[0]["content"] == "42"; res["vf tool step"].append(t)
    grow = {"gold": "5", "question": "q"}
    (st, op), t = timeit(lambda: env_reset("guess", {}, grow)); res["guess reset"].append(t)
    (st, r), t = timeit(lambda: env_step(st, op, {"role": "assistant", "content": "3"})); res["guess step"].append(t)
for k, v in res.items():
    print(f"{k:24s} median {statistics.median(v):7.2f} ms  p90 {sorted(v)[int(0.9*len(v))]:7.2f} ms  (n={len(v)})")
