"""The Tinker API's overhead (issue 43): a step of the cookbook's RL loop through ``rlvr serve`` against the same
step in ``rlvr train`` (same model, prompts, batch, loss, optimizer; goal: B / A <= 1.05).

Both run in ONE invocation, one after the other (never at once), under ``flock /tmp/rlvr_cpu.lock`` (the script
says so when another job holds it, and waits):

- **A, ``rlvr train``**: ``rlvr train recipes/smoke_cpu.yaml run.steps=N validation.every_steps=0
  checkpoint.every_steps=0 metrics.samples_every=0 run.save_final=false run.output_dir=TMP`` (the embedded
  SmolLM2-135M-Instruct, full fine-tuning, 8 prompts x 8 samples, 64 new tokens, GRPO, ppo_clip 0.2/0.2,
  token_mean, AdamW lr 1e-5 betas (0.9, 0.999), grad clip 1.0, vLLM on CPU, Ray). Per step: ``timing/step_s`` of
  RUN/metrics.jsonl, its split (``timing/rollout_s``, ``reward_s``, ``train_wait_s``, ``sync_s``) and the roles'
  busy spans (RUN/timeline.jsonl: the engine's ``generate``, the trainer's ``train_step``, the sync's
  ``send_weights`` / ``receive_weights`` / probes).
- **B, the API**: ``rlvr serve --full`` with the recipe's role settings (``model.dtype``, ``rollout.kv_cache_gib``,
  ``rollout.threads``, ``trainer.threads``, ``trainer.micro_batch_size``, ``run.seed``, the engine's 128 + 64
  token window, :func:`serve_overrides`), and this process as the client (tinker SDK 0.38, the real one) running
  tinker-cookbook's ``recipes/rl_loop.py`` step: ``save_weights_and_get_sampling_client()``; one
  ``sample(prompt, num_samples=8, max_tokens=64, temperature=1, stop=[eos])`` per prompt, all submitted before
  the first is waited on; rewards; advantages; ``forward_backward(data, "ppo", clip 0.8/1.2)`` and
  ``optim_step(AdamParams(1e-5, 0.9, 0.999, 1e-8, wd 0, grad_clip_norm 1.0))`` submitted back to back, then both
  waited on. The same prompts as A's steps (rlvr's own data code on the same recipe, the same seeded
  ``PromptSampler``), scored by the same ``math`` verifier, GRPO advantages as rlvr forms them
  (``rlvr.algos.advantages.grpo``: group mean-centred, std-normalised), each divided by the batch's response
  tokens so that Tinker's summed ``ppo`` loss is rlvr's ``token_mean``. All 64 sequences are trained, as A trains
  them (the cookbook drops groups whose advantages are all 0; A does not). Per step: the wall time of the whole
  loop iteration (client side) and its phases: ``save`` (the sampler save, which is the weight sync), ``sample``
  (submit to the last result), ``prep`` (scoring, datums), ``train`` (forward_backward + optim_step).
  The server is ``rlvr serve`` itself (``rlvr.cli.main(["serve", ...])`` in a child process) with one addition:
  when it stops it writes its roles' call spans (the executor's timeline, as ``rlvr train`` writes them), so
  each phase splits into the roles' busy time and the rest (HTTP, the futures' polling, the sampling batcher's
  gather window, Ray's transfers).

The first ``--drop`` steps of each (default 1, the warm-up: vLLM's first batch, the first optimizer step) are
dropped; the figures are medians of the rest. A's ``timing/step_s`` runs from the rollout's start to the sync's
end (the metrics line and the progress bar after it are not in it; RUN/timeline.jsonl's step starts give the full
interval, printed beside).

Run (about 7 min on 2 idle cores, plus any wait for the lock):

    PYTHONPATH=. .venv/bin/python benchmarks/serve_overhead.py [--steps 7] [--json runs/serve_overhead.json]
        [--keep DIR] [--only a|b] [--url http://127.0.0.1:8000 (B against a running server: no spans)]

How to read it: ``ratio`` = median B step / median A step; above 1.05 the issue's goal is missed. The two draw
their own samples, so their work differs: the response lengths are printed beside, ``update per sequence token``
compares the update per unit of work and ``token-matched`` scales B's update to A's token count. The ``where B's
time goes`` table puts each phase's client wall time beside the roles' busy seconds in it (the server's spans)
and A's matching figure: wall well above busy is time lost in the API's plumbing (HTTP, polling, batching); busy
above A's is slower work on the server's side. ``others cpu``: CPU seconds that processes outside this run used
during the step (another session's tests); above 2 the script warns that the comparison is disturbed. The CPU
table says which of the run's own processes used the cores during the update and the whole step.

Measured here (2 cores, AVX512-BF16 so bf16; tinker 0.38.0; rlvr serve at 5d87897: the serve trainer's packed
forward and gradient-only-where-trained output layer; 2026-12-05; no other job used more than 0.3 CPU s in any
kept step):

    A, rlvr train, timing/step_s: 30.49 (dropped) | 22.96 22.29 19.96 19.25 22.38 24.20 -> median 22.33 s
       split (medians): rollout 4.28, reward 0.05, update 14.31, sync 3.65; 32.3 tokens a response
    B, cookbook loop via rlvr serve: 23.63 (dropped) | 21.92 22.05 20.69 21.84 22.92 20.51 -> median 21.88 s
       split (medians): save (= sync) 3.38, sample 4.05, prep 0.13, forward_backward + optim_step 14.01;
       25.6 tokens a response
    ratio 0.980x (goal <= 1.05); token-matched 0.998x; update per sequence token 2.917 vs 2.727 ms (1.070x)
    plumbing (client wall - roles busy): sync 0.07 s, sampling 0.07 s (the first engine call starts 0.06 s into
    the phase: the SDK's 8 requests and the batcher's 50 ms gather gap), update 0.02 s, client-side scoring and
    datums 0.13 s (A: 0.05 in its reward pool); roles busy 21.61 s of B's 21.88 s step

Earlier runs of this script on the same machine, before rlvr serve's trainer changed: 1.203x (padded
micro-batches, the output layer with gradient on every datum position) and 1.153x (after 0f9d2b6 packed them),
the gap in the update both times (1.153x: 19.03 s busy against 16.28 s, the head on 4,780 rows where rlvr train
runs it on the 1,772 response tokens). An in-process replay of one step's 64 sequences (forward + backward) then
gave: padded with the head on every position 16.27 s, padded with the head on response positions 15.25 s,
packed with the head on response positions (rlvr train's) 14.97 s. ea79c0e (the head with gradient on trained
positions only) closed it. Run to run, A's median moved 22.3-24.7 s on an idle machine: differences under ~5%
are within the noise of 6 kept steps.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPE = "recipes/smoke_cpu.yaml"
LOCK = "/tmp/rlvr_cpu.lock"
PY = str(ROOT / ".venv" / "bin" / "python")
SYNC_METHODS = ("send_weights", "receive_weights", "loaded_blocks", "probe_logprobs")
"""The roles' calls of one weight sync (RUN/timeline.jsonl of rlvr train: the trainer sends, the engines receive
and load, then both score the probe)."""
A_TIMING = ("timing/step_s", "timing/rollout_s", "timing/reward_s", "timing/train_s", "timing/train_wait_s",
            "timing/sync_s", "sync/seconds", "response/length_mean", "train/tokens", "reward/mean")
SERVER_START_S = 300
"""How long B's server may take to answer /api/v1/healthz (it starts its roles first)."""
FOREIGN_CPU_WARN_S = 2.0
"""CPU seconds that processes outside this run may use in a kept step before the report warns (2 cores)."""
CPU_TABLE_MIN_S = 0.05
"""The CPU table's rows: processes with a median of at least this many CPU seconds in one of its columns."""
ADAM_EPS = 1e-8
"""B's AdamParams eps: torch.optim.AdamW's default, which rlvr train's AdamW uses (rlvr/train/policy.py passes
no eps)."""


# ------------------------------------------------------------------------------------------------------ plumbing
@contextlib.contextmanager
def cpu_lock():
    """Hold ``/tmp/rlvr_cpu.lock`` (flock) for the heavy work; say so when another job holds it, then wait."""
    with open(LOCK, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {LOCK}: another job (e.g. a server another session runs) holds it; the benchmark "
                  "starts when it is free", flush=True)
            t = time.time()
            fcntl.flock(f, fcntl.LOCK_EX)
            print(f"got {LOCK} after {time.time() - t:.0f}s", flush=True)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spans_in(spans: list[dict], t0: float, t1: float, role: str | None = None, methods: tuple[str, ...] = ()) -> float:
    """Busy seconds of the spans (role prefix, methods) clipped to [t0, t1]."""
    total = 0.0
    for s in spans:
        if role is not None and not s["role"].startswith(role):
            continue
        if methods and s["method"] not in methods:
            continue
        total += max(0.0, min(s["end"], t1) - max(s["start"], t0))
    return total


def union_in(spans: list[dict], t0: float, t1: float, methods: tuple[str, ...] = ()) -> float:
    """Seconds of [t0, t1] in which at least one span (of ``methods``; all when empty) runs, any role."""
    iv = sorted((max(s["start"], t0), min(s["end"], t1)) for s in spans
                if s["end"] > t0 and s["start"] < t1 and (not methods or s["method"] in methods))
    total, cur0, cur1 = 0.0, None, None
    for a, b in iv:
        if cur1 is None or a > cur1:
            if cur1 is not None:
                total += cur1 - cur0
            cur0, cur1 = a, b
        else:
            cur1 = max(cur1, b)
    if cur1 is not None:
        total += cur1 - cur0
    return total


class CpuWatch:
    """Every ``period_s``: the machine's busy CPU seconds (/proc/stat) and the CPU seconds of each process of this
    process's tree (the roles, the server, ``rlvr train``, their Ray workers, this client), labelled
    (:meth:`_label`). :meth:`foreign`: the CPU seconds others used in a window (another session's tests, the
    kernel); :meth:`by_label`: what each of ours used (which process competes with the trainer for the 2 cores)."""

    def __init__(self, period_s: float = 0.5) -> None:
        import threading

        self.tick = os.sysconf("SC_CLK_TCK")
        self.samples: list[tuple[float, float, dict[int, tuple[str, float]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        self._thread.start()

    def _busy(self) -> float:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (sum(v[:8]) - v[3] - v[4]) / self.tick  # all but idle and iowait (guest time is inside user)

    @staticmethod
    def _label(pid: int, comm: str) -> str:
        if pid == os.getpid():
            return "client (this script)"
        if comm.startswith("ray::") or comm in ("raylet", "gcs_server"):
            return comm
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            if "--serve-child" in cmd:
                return "rlvr serve (server process)"
            if "rlvr.cli train" in cmd:
                return "rlvr train (controller process)"
            if "ray/dashboard" in cmd or "ray/_private" in cmd:
                return "ray (dashboard, agents, log monitor)"
        return comm

    def _ours(self) -> dict[int, tuple[str, float]]:
        stats = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    with open(f"/proc/{d}/stat") as f:
                        raw = f.read()
                    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
                    f_ = raw.rsplit(")", 1)[1].split()
                    stats[int(d)] = (int(f_[1]), comm, (int(f_[11]) + int(f_[12])) / self.tick)  # ppid, utime+stime
        kids: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in stats.items():
            kids.setdefault(ppid, []).append(pid)
        out, todo = {}, [os.getpid()]
        while todo:
            pid = todo.pop()
            if pid in stats:
                out[pid] = (self._label(pid, stats[pid][1]), stats[pid][2])
            todo.extend(kids.get(pid, []))
        return out

    def _run(self, period_s: float) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self._busy(), self._ours()))
            self._stop.wait(period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _pair(self, t0: float, t1: float):
        a = min(self.samples, key=lambda x: abs(x[0] - t0))
        b = min(self.samples, key=lambda x: abs(x[0] - t1))
        return a, b

    def by_label(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds of each of our processes (by label) between the samples nearest t0 and t1."""
        if not self.samples:
            return {}
        a, b = self._pair(t0, t1)
        out: dict[str, float] = {}
        for pid, (label, cpu) in b[2].items():
            out[label] = out.get(label, 0.0) + cpu - a[2].get(pid, (label, 0.0))[1]
        return out

    def foreign(self, t0: float, t1: float) -> float | None:
        """CPU seconds used outside this process tree between the samples nearest t0 and t1."""
        if not self.samples:
            return None
        a, b = self._pair(t0, t1)
        ours = sum(self.by_label(t0, t1).values())
        return max(0.0, (b[1] - a[1]) - ours)


# ----------------------------------------------------------------------------------------------------- A: train
def run_a(steps: int, work: Path) -> dict:
    from rlvr.metrics.timeline import TIMELINE_FILE, read_timeline

    out = work / "a"
    cmd = [PY, "-m", "rlvr.cli", "train", RECIPE, f"run.steps={steps}", "validation.every_steps=0",
           "checkpoint.every_steps=0", "metrics.samples_every=0", "run.save_final=false", f"run.output_dir={out}"]
    print("A:", " ".join(cmd[2:]), flush=True)
    t = time.time()
    with open(work / "a_stdout.log", "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"A: rlvr train failed (rc {rc}); see {work / 'a_stdout.log'}")
    metrics_file = next(out.rglob("metrics.jsonl"))
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("step", 0) >= 1 and "timing/step_s" in r]
    tl_file = metrics_file.parent / TIMELINE_FILE
    timeline = read_timeline(tl_file)
    # the timeline's times are relative to the loop's start; its last line was written as the last step ended
    origin = tl_file.stat().st_mtime - max(x["end"] for x in timeline)
    per = []
    for r in rows:
        row = {k: r.get(k) for k in A_TIMING}
        row["step"] = r["step"]
        tl = next((x for x in timeline if x["step"] == r["step"]), None)
        if tl is not None:
            sp = [{"role": a, "method": m, "start": s, "end": e} for a, m, s, e in tl["spans"]]
            row["busy"] = {
                "generate": spans_in(sp, -1e9, 1e9, "engine", ("generate",)),
                "train": spans_in(sp, -1e9, 1e9, "trainer", ("train_step",)),
                "sync": union_in(sp, -1e9, 1e9, SYNC_METHODS),
                "reward": spans_in(sp, -1e9, 1e9, "reward"),
            }
            row["timeline_start"] = tl["start"]
            row["wall"] = (origin + tl["start"], origin + tl["end"])
            tr = [x for x in sp if x["role"].startswith("trainer") and x["method"] == "train_step"]
            if tr:
                row["train_wall"] = (origin + min(x["start"] for x in tr), origin + max(x["end"] for x in tr))
        per.append(row)
    for a, b in zip(per, per[1:]):  # the full interval between step starts (metrics logging included)
        if "timeline_start" in a and "timeline_start" in b:
            a["interval_s"] = b["timeline_start"] - a["timeline_start"]
    print(f"A: done in {time.time() - t:.0f}s ({metrics_file}); load average now {os.getloadavg()[0]:.2f}",
          flush=True)
    return {"command": " ".join(cmd[2:]), "steps": per, "run_dir": str(metrics_file.parent),
            "loadavg_1m_end": os.getloadavg()[0]}


# ----------------------------------------------------------------------------------------------------- B: serve
def serve_overrides(r) -> list[str]:
    """The recipe's settings that shape the served roles' speed (the rest: rlvr serve's defaults, which are the
    recipe's too: vLLM engine, Ray, trainer backend auto = torch at one rank, packing auto)."""
    return [f"model.dtype={r.model.dtype}", f"rollout.engine={r.rollout.engine}",
            f"rollout.kv_cache_gib={r.rollout.kv_cache_gib}", f"rollout.threads={r.rollout.threads}",
            f"trainer.threads={r.trainer.threads}", f"trainer.micro_batch_size={r.trainer.micro_batch_size}",
            f"trainer.backend={r.trainer.backend}", f"run.seed={r.run.seed}", f"run.executor={r.run.executor}",
            f"rollout.max_new_tokens={r.rollout.max_new_tokens}", f"data.max_prompt_tokens={r.data.max_prompt_tokens}",
            f"sync.timeout_s={r.sync.timeout_s}"]


def serve_child(spans_path: str, argv: list[str]) -> int:
    """``rlvr serve`` as the CLI runs it, plus the roles' call spans written to ``spans_path`` when it stops."""
    from rlvr.cli import main
    from rlvr.serve import server as srv

    close, unload = srv.Server.close, srv.Server.unload
    spans: list[dict] = []

    def keep(run) -> None:
        tl = getattr(run.roles.ex, "timeline", None)
        for s in list(tl.spans) if tl is not None else []:
            spans.append({"model": run.model_id, "role": s.role, "method": s.method, "start": s.start, "end": s.end})

    def unload_and_keep(self, model_id: str) -> None:  # a session's end unloads its model before the server stops
        run = self.models.get(model_id)
        if run is not None:
            keep(run)
        unload(self, model_id)

    def close_and_dump(self) -> None:
        for run in list(self.models.values()):
            keep(run)
        Path(spans_path).write_text(json.dumps(spans))
        close(self)

    srv.Server.close = close_and_dump
    srv.Server.unload = unload_and_keep
    return main(argv)


def start_server(work: Path, overrides: list[str]) -> tuple[subprocess.Popen, str, Path]:
    from rlvr.hardware import free_port

    port = free_port()
    spans = work / "b_spans.json"
    argv = ["serve", "--full", "--port", str(port), "--state-dir", str(work / "b_state"), *overrides]
    print("B: rlvr", " ".join(argv), flush=True)
    log = open(work / "b_server.log", "w")
    proc = subprocess.Popen([PY, __file__, "--serve-child", str(spans), "--", *argv], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + SERVER_START_S
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"B: the server exited (rc {proc.returncode}); see {work / 'b_server.log'}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/api/v1/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return proc, url, spans
        time.sleep(0.5)
    raise SystemExit(f"B: the server did not answer /api/v1/healthz within {SERVER_START_S} s")


def stop_server(proc: subprocess.Popen) -> None:
    """SIGINT (uvicorn's clean exit: the roles are stopped, the spans written), then SIGTERM, then SIGKILL of the
    server's own process group."""
    for sig, wait in ((signal.SIGINT, 90), (signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig) if sig == signal.SIGKILL else proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)


def load_data(r):
    """The recipe's prompts as ``rlvr train`` loads them, its tokenizer and the primary verifier."""
    from transformers import AutoTokenizer

    from rlvr.models import model_context
    from rlvr.reward.base import build_verifier
    from rlvr.runtime.checks import load_prompts

    model_dir, ctx = model_context(r.model.path)
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts, _ = load_prompts(r, tok, ctx)
    return prompts, tok, build_verifier(r.reward.verifiers[0])


def run_b(url: str, r, steps: int) -> dict:
    """The cookbook's rl_loop step against ``url``, ``steps`` times; per step the client-side phase times
    (``time.time()``, comparable with the roles' spans)."""
    import tinker
    import torch
    from tinker import types
    from tinker.types.tensor_data import TensorData

    from rlvr.algos.advantages import GRPOSettings, grpo
    from rlvr.data import PromptSampler
    from rlvr.models.embedded import UPSTREAM_NAMES

    os.environ.setdefault("TINKER_API_KEY", "tml-bench")
    prompts, tok, verifier = load_data(r)
    sampler = PromptSampler(len(prompts), r.rollout.prompts_per_step, r.run.seed, r.data.shuffle)
    g = r.rollout.samples_per_prompt
    sp = types.SamplingParams(max_tokens=r.rollout.max_new_tokens, temperature=r.rollout.temperature,
                              stop=[tok.eos_token_id])
    pl = r.algorithm.policy_loss.settings
    ppo_cfg = {"clip_low_threshold": 1.0 - pl.clip_low, "clip_high_threshold": 1.0 + pl.clip_high}
    tr = r.trainer
    adam = types.AdamParams(learning_rate=tr.lr, beta1=tr.betas[0], beta2=tr.betas[1], eps=ADAM_EPS,
                            weight_decay=tr.weight_decay, grad_clip_norm=tr.grad_clip)
    t = time.time()
    sc = tinker.ServiceClient(base_url=url)
    # --full: every weight trained, whatever rank is asked; the server starts the model's roles now
    # the name rlvr serve gives the recipe's embedded model (HuggingFaceTB/SmolLM2-135M-Instruct)
    tc = sc.create_lora_training_client(base_model=UPSTREAM_NAMES[r.model.path], rank=8).result()
    print(f"B: training client ready in {time.time() - t:.1f}s (the server started its roles)", flush=True)
    per = []
    for step in range(1, steps + 1):
        batch = [prompts[i] for i in sampler.next_batch()]
        m: dict = {"step": step}
        t0 = time.time()
        sampling_client = tc.save_weights_and_get_sampling_client().result()
        t1 = time.time()
        futures = [sampling_client.sample(prompt=types.ModelInput.from_ints(p.prompt_ids), num_samples=g,
                                          sampling_params=sp) for p in batch]
        t_sub = time.time()
        results = [f.result() for f in futures]
        t2 = time.time()
        rewards, seqs = [], []
        for p, res in zip(batch, results):
            row = []
            for s in res.sequences:
                text = tok.decode(s.tokens, skip_special_tokens=True)
                row.append(float(verifier.verify(text, p.gold, **p.row).score))
                seqs.append((p, list(s.tokens), list(s.logprobs)))
            rewards.append(row)
        adv = grpo(torch.tensor(rewards), GRPOSettings(std_normalize=True)).flatten().tolist()  # [P*G]
        n_resp = sum(len(toks) for _, toks, _ in seqs)
        datums = []
        for (p, toks, lps), a in zip(seqs, adv):
            ob = len(p.prompt_ids) - 1
            mi = types.ModelInput.from_ints(p.prompt_ids + toks[:-1])
            datums.append(types.Datum(model_input=mi, loss_fn_inputs={
                "target_tokens": TensorData.from_torch(torch.tensor([0] * ob + toks)),
                "logprobs": TensorData.from_torch(torch.tensor([0.0] * ob + lps)),
                "advantages": TensorData.from_torch(torch.tensor([0.0] * ob + [a / n_resp] * len(toks)))}))
        lens = sorted((len(p.prompt_ids) + len(toks) - 1 for p, toks, _ in seqs), reverse=True)
        mbs = max(1, r.trainer.micro_batch_size)
        m["tokens"] = {  # what the serve trainer computes (ServeTrainer: right-padded micro-batches, longest first)
            "datum_tokens": sum(lens),
            "padded_tokens": sum(len(lens[k : k + mbs]) * lens[k] for k in range(0, len(lens), mbs)),
            "response_tokens": n_resp, "datums": len(lens)}
        t3 = time.time()
        fb = tc.forward_backward(datums, "ppo", ppo_cfg)
        op = tc.optim_step(adam)
        fb.result()
        t_fb = time.time()
        out = op.result()
        t4 = time.time()
        m.update(step_s=t4 - t0, save_s=t1 - t0, sample_s=t2 - t1, submit_s=t_sub - t1, prep_s=t3 - t2,
                 train_s=t4 - t3, fb_wait_s=t_fb - t3, optim_after_fb_s=t4 - t_fb,
                 marks={"t0": t0, "t1": t1, "t2": t2, "t3": t3, "t_fb": t_fb, "t4": t4},
                 response_length_mean=n_resp / len(seqs), reward_mean=sum(map(sum, rewards)) / len(seqs),
                 loadavg_1m=os.getloadavg()[0],
                 grad_norm=out.metrics.get("grad_norm") if out.metrics else None)
        per.append(m)
        print(f"B: step {step}: {m['step_s']:.1f}s (save {m['save_s']:.1f}, sample {m['sample_s']:.1f}, prep "
              f"{m['prep_s']:.2f}, train {m['train_s']:.1f}), {m['response_length_mean']:.1f} tokens/response",
              flush=True)
    with contextlib.suppress(Exception):
        sc.close("success").result(timeout=10)
    return {"steps": per}


def attach_spans(b: dict, spans: list[dict]) -> None:
    """Per B step and phase: the roles' busy seconds inside the client's phase window."""
    for m in b["steps"]:
        k = m["marks"]
        gen = [s for s in spans if s["method"] == "generate" and k["t1"] <= s["start"] < k["t2"]]  # sampling's
        m["busy"] = {
            "save": union_in(spans, k["t0"], k["t1"]),  # send/receive_weights, probes (the sync)
            "save_methods": sorted({s["method"] for s in spans if k["t0"] <= s["start"] < k["t1"]}),
            "save_trainer": spans_in(spans, k["t0"], k["t1"], "trainer"),
            "save_engine": spans_in(spans, k["t0"], k["t1"], "engine"),
            "sample": spans_in(spans, k["t1"], k["t2"], "engine", ("generate",)),
            "sample_calls": len(gen),
            "sample_first_start": min((s["start"] - k["t1"] for s in gen), default=None),
            "sample_last_end": max((k["t2"] - s["end"] for s in gen), default=None),
            "forward_backward": spans_in(spans, k["t3"], k["t4"], "trainer", ("forward_backward",)),
            "optim_step": spans_in(spans, k["t3"], k["t4"], "trainer", ("optim_step",)),
            "any_role": union_in(spans, k["t0"], k["t4"]),
        }


# -------------------------------------------------------------------------------------------------------- report
def report(a: dict | None, b: dict | None, drop: int, watch: CpuWatch | None = None) -> dict:
    out: dict = {}
    ka = [s for s in a["steps"] if s["step"] > drop] if a is not None else []  # the kept (measured) steps
    kb = [s for s in b["steps"] if s["step"] > drop] if b is not None else []
    if watch is not None:  # CPU seconds others used in each step (2 cores: up to 2 per second)
        for s in (a or {}).get("steps", []):
            s["foreign_cpu_s"] = watch.foreign(*s["wall"]) if "wall" in s else None
            s["cpu_step"] = watch.by_label(*s["wall"]) if "wall" in s else {}
            s["cpu_update"] = watch.by_label(*s["train_wall"]) if "train_wall" in s else {}
        for s in (b or {}).get("steps", []):
            s["foreign_cpu_s"] = watch.foreign(s["marks"]["t0"], s["marks"]["t4"])
            s["cpu_step"] = watch.by_label(s["marks"]["t0"], s["marks"]["t4"])
            s["cpu_update"] = watch.by_label(s["marks"]["t3"], s["marks"]["t4"])
    if a is not None:
        out["a"] = {k: med([s[k] for s in ka if s.get(k) is not None]) for k in A_TIMING}
        out["a"]["interval_s"] = med([s["interval_s"] for s in ka if "interval_s" in s])
        out["a"]["busy"] = {k: med([s["busy"][k] for s in ka if "busy" in s]) for k in ka[0].get("busy", {})}
        print(f"\nA, rlvr train (per step; first {drop} step(s) dropped as warm-up; interval: to the next step's "
              "start, so the last step has none and its median covers one step fewer):")
        print(f"{'step':>4} {'step_s':>7} {'rollout':>7} {'reward':>6} {'train':>6} {'t_wait':>6} {'sync':>5} "
              f"{'interval':>8} {'resp tok':>8} {'others cpu':>10}")
        for s in a["steps"]:
            print(f"{s['step']:>4} {s['timing/step_s']:7.2f} {s['timing/rollout_s']:7.2f} {s['timing/reward_s']:6.2f} "
                  f"{s['timing/train_s']:6.2f} {s['timing/train_wait_s']:6.2f} {s['timing/sync_s']:5.2f} "
                  f"{s.get('interval_s', float('nan')):8.2f} {s['response/length_mean']:8.1f} "
                  f"{s.get('foreign_cpu_s') if s.get('foreign_cpu_s') is not None else float('nan'):10.1f}")
        x = out["a"]
        print(f"median{'':>1}{x['timing/step_s']:6.2f} {x['timing/rollout_s']:7.2f} {x['timing/reward_s']:6.2f} "
              f"{x['timing/train_s']:6.2f} {x['timing/train_wait_s']:6.2f} {x['timing/sync_s']:5.2f} "
              f"{x['interval_s']:8.2f} {x['response/length_mean']:8.1f}")
    if b is not None:
        keys = ("step_s", "save_s", "sample_s", "submit_s", "prep_s", "train_s", "fb_wait_s", "optim_after_fb_s",
                "response_length_mean")
        out["b"] = {k: med([s[k] for s in kb]) for k in keys}
        if kb and "busy" in kb[0]:
            out["b"]["busy"] = {k: med([s["busy"][k] for s in kb if s["busy"][k] is not None])
                                for k in kb[0]["busy"] if k != "save_methods"}
        print(f"\nB, the cookbook's loop through rlvr serve (per step, client wall clock; first {drop} step(s) "
              "dropped):")
        print(f"{'step':>4} {'step_s':>7} {'save':>6} {'sample':>6} {'prep':>5} {'train':>6} {'fb':>6} "
              f"{'optim':>5} {'resp tok':>8} {'others cpu':>10}")
        for s in b["steps"]:
            print(f"{s['step']:>4} {s['step_s']:7.2f} {s['save_s']:6.2f} {s['sample_s']:6.2f} {s['prep_s']:5.2f} "
                  f"{s['train_s']:6.2f} {s['fb_wait_s']:6.2f} {s['optim_after_fb_s']:5.2f} "
                  f"{s['response_length_mean']:8.1f} "
                  f"{s.get('foreign_cpu_s') if s.get('foreign_cpu_s') is not None else float('nan'):10.1f}")
        y = out["b"]
        print(f"median{'':>1}{y['step_s']:6.2f} {y['save_s']:6.2f} {y['sample_s']:6.2f} {y['prep_s']:5.2f} "
              f"{y['train_s']:6.2f} {y['fb_wait_s']:6.2f} {y['optim_after_fb_s']:5.2f} "
              f"{y['response_length_mean']:8.1f}")
    if a is not None and b is not None:
        x, y = out["a"], out["b"]
        out["ratio"] = y["step_s"] / x["timing/step_s"]
        out["ratio_interval"] = y["step_s"] / x["interval_s"]
        print(f"\nratio median(B) / median(A step_s) = {y['step_s']:.2f} / {x['timing/step_s']:.2f} = "
              f"{out['ratio']:.3f}x (goal <= 1.05); against A's full step interval {x['interval_s']:.2f}: "
              f"{out['ratio_interval']:.3f}x")
        if "busy" in y and x.get("busy"):
            yb, xb = y["busy"], x["busy"]
            print("\nwhere B's time goes (medians, s): client wall | roles busy in it | A's figure")
            rows = [("sync (B: save_weights_and_get_sampling_client)", y["save_s"], yb["save"], x["timing/sync_s"],
                     xb["sync"]),
                    ("sampling (B: 8 sample calls)", y["sample_s"], yb["sample"], x["timing/rollout_s"],
                     xb["generate"]),
                    ("scoring + datums (B: client)", y["prep_s"], 0.0, x["timing/reward_s"], xb["reward"]),
                    ("update (B: forward_backward + optim_step)", y["train_s"],
                     yb["forward_backward"] + yb["optim_step"], x["timing/train_wait_s"], xb["train"])]
            print(f"{'phase':<48} {'B wall':>7} {'B busy':>7} {'A wall':>7} {'A busy':>7}")
            for name, bw, bb, aw, ab in rows:
                print(f"{name:<48} {bw:7.2f} {bb:7.2f} {aw:7.2f} {ab:7.2f}")
            print(f"B: {yb['sample_calls']:.0f} engine call(s) per sampling phase (median), the first starting "
                  f"{yb['sample_first_start']:.2f}s after the phase began, the last ending "
                  f"{yb['sample_last_end']:.2f}s "
                  f"before the client had every result; forward_backward {yb['forward_backward']:.2f}s + optim_step "
                  f"{yb['optim_step']:.2f}s busy; some role busy {yb['any_role']:.2f}s of the {y['step_s']:.2f}s step")
    if a is not None and b is not None and watch is not None:
        def cpu(rows: list[dict], key: str) -> dict[str, float]:
            labels = {k for s in rows for k in s.get(key, {})}
            return {k: med([s.get(key, {}).get(k, 0.0) for s in rows]) for k in labels}

        table = {"b_update": cpu(kb, "cpu_update"), "a_update": cpu(ka, "cpu_update"),
                 "b_step": cpu(kb, "cpu_step"), "a_step": cpu(ka, "cpu_step")}
        out["cpu_by_process"] = table
        labels = sorted({k for t in table.values() for k, v in t.items() if v >= CPU_TABLE_MIN_S},
                        key=lambda k: -max(t.get(k, 0.0) for t in table.values()))
        print("\nCPU seconds by process (medians per step; 2 cores), during the update and the whole step:")
        print(f"{'process':<40} {'B update':>8} {'A update':>8} {'B step':>7} {'A step':>7}")
        for k in labels:
            print(f"{k[:40]:<40} {table['b_update'].get(k, 0.0):8.2f} {table['a_update'].get(k, 0.0):8.2f} "
                  f"{table['b_step'].get(k, 0.0):7.2f} {table['a_step'].get(k, 0.0):7.2f}")
    if b is not None:
        tk = {k: med([s["tokens"][k] for s in kb]) for k in kb[0]["tokens"]}
        out.setdefault("b", {})["tokens"] = tk
        print(f"B's update per step (medians): {tk['datum_tokens']:.0f} datum tokens ({tk['padded_tokens']:.0f} "
              f"positions if right-padded in micro-batches, longest first), {tk['response_tokens']:.0f} of them "
              "response tokens (where the loss has a gradient)")
    if a is not None and b is not None:
        # the samples differ (A's and B's engines draw their own), so the work differs: per token, and B's update
        # scaled to A's token count
        a_ms = med([s["timing/train_s"] / s["train/tokens"] * 1e3 for s in ka])
        # a datum is its sequence less the last token: + 1 a datum is A's count (prompt + response)
        b_tok = [s["tokens"]["datum_tokens"] + s["tokens"]["datums"] for s in kb]
        b_ms = med([s["train_s"] / t * 1e3 for s, t in zip(kb, b_tok)])
        a_tok = med([s["train/tokens"] for s in ka])
        adjusted = [s["step_s"] + s["train_s"] * (a_tok / t - 1.0) for s, t in zip(kb, b_tok)]
        out["update_ms_per_token"] = {"a": a_ms, "b": b_ms, "ratio": b_ms / a_ms}
        out["ratio_token_matched"] = med(adjusted) / out["a"]["timing/step_s"]
        print(f"update per sequence token (ms): A {a_ms:.3f} (train_s / train/tokens), B {b_ms:.3f} (forward_backward "
              f"+ optim_step wall / datum tokens + 1 a sequence): {b_ms / a_ms:.3f}x")
        print(f"B's step with its update scaled to A's median {a_tok:.0f} tokens: median {med(adjusted):.2f}s, "
              f"{out['ratio_token_matched']:.3f}x A's")
        busy = [s["step"] for s in ka + kb if (s.get("foreign_cpu_s") or 0.0) > FOREIGN_CPU_WARN_S]
        if busy:
            print(f"WARNING: other processes used > {FOREIGN_CPU_WARN_S:g} CPU seconds in steps {busy} (column "
                  "'others cpu'): the comparison is disturbed; run it again on an idle machine")
    return out


def code_version() -> dict:
    """The commit measured, and the files of rlvr/ that differ from it (another session's edits in progress)."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": git("status", "--short", "--", "rlvr").splitlines()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--drop", type=int, default=1, help="warm-up steps left out of the medians")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--keep", help="work folder to keep (default: a temporary one, removed)")
    ap.add_argument("--only", choices=("a", "b"))
    ap.add_argument("--url", help="B against this running server (no server started, no role spans)")
    ap.add_argument("--serve-child", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.serve_child:
        sys.exit(serve_child(args.serve_child, [x for x in rest if x != "--"]))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rlvr.recipe import load_recipe

    r = load_recipe(ROOT / RECIPE)
    tmp = None if args.keep else tempfile.TemporaryDirectory(prefix="serve_overhead_")
    work = Path(args.keep or tmp.name).resolve()
    work.mkdir(parents=True, exist_ok=True)
    a = b = None
    t_all = time.time()
    with cpu_lock():
        watch = CpuWatch()
        if args.only != "b":
            a = run_a(args.steps, work)
        if args.only != "a":
            if args.url:
                b = run_b(args.url, r, args.steps)
            else:
                overrides = serve_overrides(r)
                proc, url, spans_file = start_server(work, overrides)
                try:
                    b = run_b(url, r, args.steps)
                finally:
                    stop_server(proc)
                if spans_file.exists():
                    attach_spans(b, json.loads(spans_file.read_text()))
                else:
                    print(f"B: no spans written (see {work / 'b_server.log'})")
                b["overrides"] = overrides
        watch.stop()
    summary = report(a, b, args.drop, watch)
    summary["code"] = code_version()
    print(f"\ntotal {time.time() - t_all:.0f}s; work folder {work}{' (removed)' if tmp else ''}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"a": a, "b": b, "summary": summary, "steps": args.steps,
                                               "drop": args.drop}, indent=1))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
