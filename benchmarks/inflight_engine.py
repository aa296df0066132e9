"""Which engine mechanism for in-flight updates (issue 39: "pick by measurement"): driving the synchronous engine's
``LLMEngine.step()`` in a loop of our own (:class:`rlvr.rollout.inflight.EngineLoop`, PipelineRL's way) against
vLLM's async engine (``AsyncLLM.pause_generation(mode="keep")`` / ``resume_generation()``), on this machine's CPU.

One process, the embedded SmolLM2-135M (in ``model.dtype: auto``'s dtype for this CPU) (``--model``; ``tiny-random`` for a quick look), one thread, ``--prompts``
prompts x ``--samples`` samples x ``--tokens`` tokens (ignore eos), seeded, in the same order:

1. throughput: vLLM's own ``LLM.generate`` (the lock-step engine), the same batch through the loop, and through
   ``AsyncLLM`` (all requests submitted, awaited together): tokens/s, median of ``--repeats``;
2. the cost of one weight update landing mid-generation, the load itself a no-op: the loop (a job between two decode
   steps) and ``AsyncLLM`` (``pause_generation(mode="keep")``, ``resume_generation()``): the wall time from asking
   to generation going on, and the batch's total time against the same batch without an update.

    PYTHONPATH=. .venv/bin/python benchmarks/inflight_engine.py            # ~6 min on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from types import SimpleNamespace


def _params(n_tokens: int, seed: int, delta: bool):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(max_tokens=n_tokens, temperature=1.0, logprobs=0, ignore_eos=True, seed=seed,
                          output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY)


def _prompts(tok, n: int) -> list[list[int]]:
    qs = [f"Question {i}: what is {i} + {2 * i}? Think step by step." for i in range(n)]
    return [tok(q)["input_ids"] for q in qs]


def lock_step(engine, prompts, samples, tokens) -> float:
    reqs = [{"prompt_token_ids": p} for p in prompts for _ in range(samples)]
    ps = [_params(tokens, 1000 + k, False) for k in range(len(reqs))]
    t0 = time.perf_counter()
    engine.llm.generate(reqs, ps, use_tqdm=False)
    return time.perf_counter() - t0


def loop_batch(engine, prompts, samples, tokens, update_after_s: float | None = None) -> tuple[float, float | None]:
    reqs = [(p, _params(tokens, 1000 + k, True)) for k, p in enumerate(p for p in prompts for _ in range(samples))]
    t0 = time.perf_counter()
    fut = engine.loop.submit(reqs)
    landed = None
    if update_after_s is not None:
        time.sleep(update_after_s)
        t1 = time.perf_counter()
        engine.loop.update(lambda: None, engine.loop.version + 1).result()
        landed = time.perf_counter() - t1
    fut.result()
    return time.perf_counter() - t0, landed


def async_batch(model_dir, prompts, samples, tokens, repeats, update_after_s) -> tuple[list[float], list[float], list[float]]:
    """(plain times, times with one pause/resume, pause+resume latencies) on vLLM's AsyncLLM."""
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from rlvr.rollout.vllm_engine import CPU_BLOCK_SIZE, kv_cache_bytes

    from rlvr.hardware import fast_dtype

    args = AsyncEngineArgs(model=model_dir, dtype=fast_dtype(0.0), max_model_len=1024, enforce_eager=True,
                           kv_cache_memory_bytes=kv_cache_bytes(1.0), block_size=CPU_BLOCK_SIZE,
                           enable_prefix_caching=True, enable_chunked_prefill=False, max_num_batched_tokens=8192)

    async def one(eng, rid, p, k):
        async for _ in eng.generate({"prompt_token_ids": p}, _params(tokens, 1000 + k, True), request_id=rid):
            pass

    async def batch(eng, tag, pause_after):
        reqs = [p for p in prompts for _ in range(samples)]
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(one(eng, f"{tag}-{k}", p, k)) for k, p in enumerate(reqs)]
        lat = None
        if pause_after is not None:
            await asyncio.sleep(pause_after)
            t1 = time.perf_counter()
            await eng.pause_generation(mode="keep", clear_cache=False)
            await eng.resume_generation()
            lat = time.perf_counter() - t1
        await asyncio.gather(*tasks)
        return time.perf_counter() - t0, lat

    async def main():
        eng = AsyncLLM.from_engine_args(args)
        try:
            await batch(eng, "warm", None)
            plain = [(await batch(eng, f"p{i}", None))[0] for i in range(repeats)]
            with_pause = [await batch(eng, f"u{i}", update_after_s) for i in range(repeats)]
            return plain, [t for t, _ in with_pause], [x for _, x in with_pause]
        finally:
            eng.shutdown()

    return asyncio.run(main())


def _one_engine_env(threads: int) -> None:
    """The engines built in a process of vLLM's own (``AsyncLLM``'s core, the multiprocessing ``LLM``) get the
    same OpenMP threads as the in-process ones (``VLLMEngine(threads=...)``): unbound, ``threads`` of them (left to
    vLLM, its CPU worker binds every free core, 2 against 1 here, and the comparison measures the threads)."""
    import os

    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"


def mp_generate(model_dir, prompts, a) -> list[float]:
    """``LLM.generate`` with vLLM's engine core in a process of its own (``VLLM_ENABLE_V1_MULTIPROCESSING=1``, as
    ``AsyncLLM`` always has it; rlvr's CPU engines keep it in process, in flight on every platform): what the split
    alone buys, without pause/resume."""
    import os

    from vllm import LLM, envs

    from rlvr.hardware import fast_dtype
    from rlvr.rollout.vllm_engine import CPU_BLOCK_SIZE, kv_cache_bytes

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    _one_engine_env(a.threads)
    envs.disable_envs_cache()
    llm = LLM(model=model_dir, dtype=fast_dtype(0.0), max_model_len=1024, enforce_eager=True,
              kv_cache_memory_bytes=kv_cache_bytes(1.0), block_size=CPU_BLOCK_SIZE, enable_prefix_caching=True,
              enable_chunked_prefill=False, max_num_batched_tokens=8192)
    plain = SimpleNamespace(llm=llm)
    try:
        lock_step(plain, prompts, a.samples, a.tokens)  # warm-up
        return [lock_step(plain, prompts, a.samples, a.tokens) for _ in range(a.repeats)]
    finally:
        llm.llm_engine.engine_core.shutdown()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        envs.disable_envs_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-async", action="store_true")
    ap.add_argument("--skip-mp", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="OpenMP threads of every engine (rlvr's default: 1)")
    a = ap.parse_args()
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from transformers import AutoTokenizer

    from rlvr.models import resolve_model
    from rlvr.rollout.vllm_engine import VLLMEngine

    model_dir = resolve_model(a.model)
    prompts = _prompts(AutoTokenizer.from_pretrained(model_dir), a.prompts)
    n_tok = a.prompts * a.samples * a.tokens
    from rlvr.hardware import fast_dtype

    eng = VLLMEngine(model_dir, dtype=fast_dtype(0.0), max_model_len=1024, kv_cache_gib=1.0, in_flight=True,
                     threads=a.threads)
    plain = VLLMEngine.__new__(VLLMEngine)  # the same LLM, driven by LLM.generate (the loop is idle meanwhile)
    plain.llm = eng.llm
    lock_step(plain, prompts, a.samples, a.tokens)  # warm-up
    ls = [lock_step(plain, prompts, a.samples, a.tokens) for _ in range(a.repeats)]
    lp = [loop_batch(eng, prompts, a.samples, a.tokens)[0] for _ in range(a.repeats)]
    half = statistics.median(lp) / 2
    lu = [loop_batch(eng, prompts, a.samples, a.tokens, half) for _ in range(a.repeats)]
    eng.shutdown()
    rows = [("LLM.generate (lock-step)", ls, None), ("EngineLoop (LLMEngine.step)", lp, None),
            ("EngineLoop, one update mid-batch", [t for t, _ in lu], [x for _, x in lu])]
    if not a.skip_mp:
        rows.append(("LLM.generate, engine core in a process of its own", mp_generate(model_dir, prompts, a), None))
    if not a.skip_async:
        _one_engine_env(a.threads)
        ap_, au, al = async_batch(model_dir, prompts, a.samples, a.tokens, a.repeats, half)
        rows += [("AsyncLLM", ap_, None), ("AsyncLLM, one pause/resume mid-batch", au, al)]
    print(f"\n{a.model}, {a.prompts} x {a.samples} samples x {a.tokens} tokens = {n_tok} tokens, medians of {a.repeats}, "
          f"{a.threads} OpenMP thread(s) an engine")
    print("| engine | batch s | tokens/s | vs LLM.generate | update or pause+resume latency s |")
    print("|---|---|---|---|---|")
    base = statistics.median(ls)
    for name, ts, lat in rows:
        m = statistics.median(ts)
        lat_s = f"{statistics.median(lat):.3f}" if lat else "-"
        print(f"| {name} | {m:.2f} | {n_tok / m:.0f} | {m / base:.2f} | {lat_s} |")


if __name__ == "__main__":
    main()
