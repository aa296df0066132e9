"""Peak memory of a weight sync: the sender's and each engine worker's resident memory (RSS) above its steady state.

Two processes (``torch.multiprocessing`` spawn) form rlvr's weight-sync group over gloo on 127.0.0.1:

- rank 0, the sender: holds the model's weights in ``--dtype`` and sends them with ``WeightSender.send`` from an
  iterator that yields a fresh copy of each tensor (``--sender copy``, the default: what a ZeRO-3 trainer's gather
  or a trainer whose parameters are in another dtype than the sync's yields) or the parameter itself
  (``--sender view``: a torch trainer whose parameters are in the sync dtype);
- rank 1 (and its tensor-parallel workers), the engine: a real vLLM engine (``VLLMEngine``, CPU) receiving with
  ``receive_weights`` (transfer, load, tied-layer refresh, prefix-cache reset).

Each process measures its own RSS from ``/proc/self/status``: ``VmRSS`` just before a sync, then the peak
(``VmHWM``, reset before the sync by writing ``5`` to ``/proc/self/clear_refs``) during it. "peak above" is the
peak minus the RSS just before; the table prints the median over ``--syncs`` syncs after a first one (which also
allocates what stays: staging buffers, gloo's connections), and that first one apart (``first sync``: on a fresh
heap, so freed memory the allocator kept from an earlier sync cannot hide a peak). A vLLM worker in another process (tensor parallel)
is measured there through ``collective_rpc``. MB = 1e6 bytes.

Models: ``embedded`` (SmolLM2-135M, the smoke recipe's; 9 heads, so no ``--tp 2``), or ``qwen2-0.5b`` (Qwen2.5-0.5B's architecture and shapes:
24 layers, hidden 896, 14/2 heads, MLP 4864, vocabulary 151936, tied embeddings; random weights, built offline
from the config with transformers and saved once under ``$RLVR_CACHE`` or ``~/.cache/rlvr``; the embedded model's
tokenizer, which only this benchmark's start-up uses).

Run (2 idle cores: ~2 min for ``embedded``, ~5 min for ``qwen2-0.5b``, whose build takes ~1 min the first time):

    PYTHONPATH=. .venv/bin/python benchmarks/sync_memory.py --model embedded [--tp 2] [--sender view]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

QWEN2_05B = dict(
    architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=896, intermediate_size=4864,
    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
    max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    hidden_act="silu", use_sliding_window=False, bos_token_id=151643, eos_token_id=151643,
)
"""Qwen2.5-0.5B's ``config.json`` fields that set its shapes (the published model card's config)."""


def _status(field: str) -> int:
    """``field`` (e.g. ``VmRSS``, ``VmHWM``) of ``/proc/self/status``, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak(_self=None) -> int:
    """Reset this process's peak RSS to its current RSS; returns the current RSS in bytes (callable through a vLLM
    worker's ``collective_rpc``, hence the unused worker argument)."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status("VmRSS")


def read_peak(_self=None) -> int:
    """This process's peak RSS (bytes) since the last :func:`reset_peak`."""
    return _status("VmHWM")


def random_qwen2(cache: Path) -> str:
    """A Qwen2.5-0.5B-shaped model folder with random weights (bf16 safetensors), built once under ``cache``."""
    out = cache / "qwen2-0.5b-random"
    if (out / "model.safetensors").exists():
        return str(out)
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from rlvr.models import resolve_model

    torch.manual_seed(0)
    cfg = Qwen2Config(**{k: v for k, v in QWEN2_05B.items() if k != "architectures"})
    cfg.architectures = QWEN2_05B["architectures"]
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    tmp = out.with_suffix(".tmp")
    model.save_pretrained(str(tmp), safe_serialization=True)
    AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct")).save_pretrained(str(tmp))
    tmp.rename(out)
    return str(out)


def model_specs(model_dir: str, dtype: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of the model's parameters in ``named_parameters`` order (the trainer's send order)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return [(n, tuple(p.shape), dtype) for n, p in model.named_parameters()]


def _sender(port: int, world: int, specs_t: list, args: dict, out: dict) -> None:
    torch.set_num_threads(1)
    import rlvr.sync.weights as W

    specs = [W.WeightSpec(n, tuple(s), d) for n, s, d in specs_t]
    gen = torch.Generator().manual_seed(0)
    weights = [(s.name, (torch.randn(s.shape, generator=gen) * 0.02).to(W.DTYPES[s.dtype])) for s in specs]
    sender = W.WeightSender(host="127.0.0.1", port=port, world_size=world, backend="gloo", timeout_s=600,
                            name="bench-mem")
    copy = args["sender"] == "copy"
    rows = []
    for _ in range(args["syncs"] + 1):
        named = ((n, t.clone() if copy else t) for n, t in weights)
        before = reset_peak()
        res = sender.send(named, bucket_mb=args["bucket_mb"])
        rows.append((before, read_peak(), res["seconds"], res["checksum"]))
    out["sender"] = rows


def _engine(port: int, world: int, specs_t: list, args: dict, out: dict) -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # a reload logs every weight at WARNING
    from rlvr.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(args["model_dir"], dtype=specs_t[0][2], max_model_len=256, threads=1,
                        kv_cache_gib=args["kv_cache_gib"], tensor_parallel_size=args["tp"])
    engine.init_weight_sync("127.0.0.1", port, 1, world, "gloo", 600, "bench-mem")
    rows = []
    for v in range(args["syncs"] + 1):
        before = engine.llm.collective_rpc(reset_peak)
        t0 = time.perf_counter()
        sums = engine.receive_weights(specs_t, v + 1, args["bucket_mb"])
        rows.append((before, engine.llm.collective_rpc(read_peak), time.perf_counter() - t0, sums))
    out["engine"] = rows


def _role(rank: int, port: int, world: int, specs_t: list, args: dict, out: dict) -> None:
    (_sender if rank == 0 else _engine)(port, world, specs_t, args, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded", choices=["embedded", "qwen2-0.5b"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--tp", type=int, default=1, help="the engine's tensor_parallel_size")
    ap.add_argument("--sender", default="copy", choices=["copy", "view"])
    ap.add_argument("--bucket-mb", type=float, default=16.0)
    ap.add_argument("--syncs", type=int, default=3, help="measured syncs after the first")
    ap.add_argument("--kv-cache-gib", type=float, default=0.25)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    from rlvr.models import resolve_model
    from rlvr.hardware import free_port
    from rlvr.sync.weights import checksums_match

    cache = Path(os.environ.get("RLVR_CACHE", Path.home() / ".cache" / "rlvr"))
    model_dir = resolve_model("smollm2-135m-instruct") if args.model == "embedded" else random_qwen2(cache)
    specs_t = model_specs(model_dir, args.dtype)
    nbytes = sum(torch.Size(s).numel() for _, s, _ in specs_t) * torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    run = dict(vars(args), model_dir=model_dir)
    world = 1 + args.tp
    with mp.Manager() as m:
        out = m.dict()
        mp.spawn(_role, args=(free_port(), world, specs_t, run, out), nprocs=2, join=True)
        out = dict(out)
    send, recv = out["sender"], out["engine"]
    if os.environ.get("RLVR_BENCH_RAW"):
        print("raw sender", [(b, p) for b, p, _, _ in send], "engine", [(b, p) for b, p, _, _ in recv])
    for (_, _, _, c), (_, _, _, sums) in zip(send, recv):
        assert all(checksums_match(c, s) for s in sums), "checksum mismatch"
    mb = 1e6
    print(f"model {args.model} ({len(specs_t)} tensors, {nbytes / mb:.0f} MB in {args.dtype}), engine TP={args.tp}, "
          f"sender yields {'copies' if args.sender == 'copy' else 'the tensors themselves'}, bucket_mb "
          f"{args.bucket_mb:g}, {args.syncs} measured syncs (+1), checksums equal; MB = 1e6 bytes")
    fig = {"model": args.model, "model_mb": nbytes / mb, "tp": args.tp, "sender": args.sender}

    def row(label: str, pairs: list[tuple[int, int]]) -> None:  # pairs: every sync, the first one included
        above = statistics.median(p - b for b, p in pairs[1:])
        first = pairs[0][1] - pairs[0][0]
        steady = statistics.median(b for b, _ in pairs[1:])
        fig[label] = {"steady_mb": steady / mb, "peak_above_mb": above / mb, "first_above_mb": first / mb}
        print(f"{label:<16} steady {steady / mb:8.0f} MB   peak above {above / mb:8.0f} MB "
              f"({above / nbytes:5.2f}x the model)   first sync {first / mb:8.0f} MB")

    row("sender", [(b, p) for b, p, _, _ in send])
    for w in range(args.tp):
        row(f"engine worker {w}", [(b[w], p[w]) for b, p, _, _ in recv])
    secs = statistics.median(s for _, _, s, _ in send[1:])
    whole = statistics.median(s for _, _, s, _ in recv[1:])
    fig.update(send_s=secs, receive_s=whole)
    print(f"send {secs:.2f} s, engine receive_weights {whole:.2f} s (medians)")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=2))


if __name__ == "__main__":
    main()
