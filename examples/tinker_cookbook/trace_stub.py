"""A fake Tinker HTTP endpoint that records which routes a client calls, in order.

NOT a server: it trains nothing and samples nothing. It answers every route the
tinker 0.38.0 SDK uses with the smallest well-formed reply (canned tokens,
constant logprobs), so that tinker-cookbook's loops run end to end and the
sequence of requests they make can be written down. Used to derive the call
list in README.md ("What the recipes call"); kept to re-check it when the SDK
or the cookbook changes.

Run it with the client venv (it imports the SDK's protobuf module, the model
name from rlvr_smollm2_hook, and the tokenizer from the prepared Hugging Face
cache):

    source examples/tinker_cookbook/env.sh
    python examples/tinker_cookbook/trace_stub.py --port 8765 --log /tmp/trace.jsonl

then point a recipe at base_url=http://127.0.0.1:8765. Every request is one
JSON line in the log: route, the request fields that matter, and the reply.
Answers with the stop token at the end, so replies look like finished turns.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from rlvr_smollm2_hook import MODEL_NAME
from tinker.proto import tinker_public_pb2 as pb

_lock = threading.Lock()
_futures: dict[str, tuple[str, object]] = {}  # request_id -> ("json", dict) | ("proto", bytes)
_seq = itertools.count()
_samplers: dict[str, dict] = {}
_models: dict[str, dict] = {}
_log_file = sys.stderr
_texts: list[list[int]] = []  # canned completions (token ids, each ending in the stop token)
_STOP_TOKEN = 2  # <|im_end|> in SmolLM2's vocabulary


def _log(entry: dict) -> None:
    entry = {"n": next(_seq), "t": round(time.time(), 3), **entry}
    with _lock:
        _log_file.write(json.dumps(entry) + "\n")
        _log_file.flush()


def _future(kind: str, payload: object, **extra) -> dict:
    rid = uuid.uuid4().hex
    with _lock:
        _futures[rid] = (kind, payload)
    return {"request_id": rid, **extra}


def _tokens_of_chunks(chunks) -> list[int]:
    out: list[int] = []
    for c in chunks:
        if c.WhichOneof("chunk") == "encoded_text":
            out.extend(np.frombuffer(c.encoded_text.tokens, dtype=np.int32).tolist())
    return out


def _forward_backward(body: bytes, forward_only: bool) -> tuple[dict, dict]:
    msg = pb.ForwardBackwardRequest()
    msg.ParseFromString(body)
    lengths, keys = [], set()
    for d in msg.data:
        keys.update(d.loss_fn_inputs.keys())
        lengths.append(len(_tokens_of_chunks(d.model_input)))
    # one logprob per target token (the target has the model input's length)
    data = np.concatenate([np.full(n, -1.0, np.float32) for n in lengths]) if lengths else np.zeros(0, np.float32)
    offsets = np.cumsum([0] + [n * 4 for n in lengths]).astype(np.int64)
    rec = pb.ArrayRecord(num_datums=len(lengths))
    rec.fields["logprobs"].CopyFrom(
        pb.BatchedTensor(data=data.tobytes(), offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32)
    )
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[rec])
    out.metrics["loss:sum"] = float(sum(lengths))
    summary = {
        "model_id": msg.model_id,
        "seq_id": msg.seq_id,
        "loss_fn": msg.loss_fn,
        "loss_fn_config": dict(msg.loss_fn_config),
        "forward_only": forward_only or msg.forward_only,
        "n_datums": len(lengths),
        "lengths": lengths[:8],
        "loss_fn_inputs_keys": sorted(keys),
    }
    return summary, _future("proto", out.SerializeToString(), model_id=msg.model_id)


def _prompt_len(req: dict) -> int:
    """Tokens in a JSON request's ``prompt`` (its chunks' ``tokens``)."""
    return sum(len(c.get("tokens", [])) for c in req["prompt"]["chunks"])


def _sample(req: dict) -> dict:
    n = req.get("num_samples", 1)
    seqs = []
    for _ in range(n):
        toks = random.choice(_texts)
        seqs.append(
            pb.SampledSequence(
                stop_reason=pb.STOP_REASON_STOP,
                tokens=np.asarray(toks, np.int32).tobytes(),
                logprobs=np.full(len(toks), -0.5, np.float32).tobytes(),
            )
        )
    resp = pb.SampleResponse(sequences=seqs)
    if req.get("prompt_logprobs"):
        lp = np.full(_prompt_len(req), -1.0, np.float32)
        lp[0] = np.nan
        resp.prompt_logprobs = lp.tobytes()
    return _future("proto", resp.SerializeToString(), sample_sequence_ids=[uuid.uuid4().hex for _ in range(n)])


def _route(path: str, headers, body: bytes) -> tuple[int, str, bytes, dict, dict]:
    """Returns status, content type, body, request summary, reply summary."""
    ctype = headers.get("Content-Type", "")
    req: dict = {}
    if body and "json" in ctype:
        req = json.loads(body)
    summary: dict = {k: v for k, v in req.items() if k not in ("prompt", "events")}
    if "prompt" in req:
        summary["prompt_len"] = _prompt_len(req)
    if "events" in req:
        summary["events"] = [e.get("event_name") or e.get("event") for e in req["events"]][:10]

    def ok(obj: dict):
        return 200, "application/json", json.dumps(obj).encode(), summary, obj

    p = path.split("?")[0]
    if p == "/api/v1/client/config":
        return ok({"pjwt_auth_enabled": False})
    if p == "/api/v1/client/dynamic_config":
        return ok({})
    if p == "/api/v1/create_session":
        return ok({"type": "create_session", "session_id": "sess-" + uuid.uuid4().hex[:8]})
    if p == "/api/v1/session_heartbeat":
        return ok({"type": "session_heartbeat"})
    if p == "/api/v1/telemetry":
        return ok({"status": "accepted"})
    if p == "/api/v1/get_server_capabilities":
        return ok({"supported_models": [{"model_name": MODEL_NAME}]})
    if p == "/api/v1/create_model":
        model_id = f"{req['session_id']}:train:{req['model_seq_id']}"
        _models[model_id] = {"base_model": req["base_model"], "lora_config": req.get("lora_config")}
        return ok(_future("json", {"type": "create_model", "model_id": model_id}, model_id=model_id))
    if p == "/api/v1/get_info":
        m = _models.get(req["model_id"], {"base_model": MODEL_NAME, "lora_config": {"rank": 8}})
        return ok(
            {
                "type": "get_info",
                "model_id": req["model_id"],
                "model_data": {"arch": "llama", "model_name": m["base_model"], "tokenizer_id": None},
                "is_lora": True,
                "lora_rank": (m.get("lora_config") or {}).get("rank"),
                "model_name": m["base_model"],
            }
        )
    if p == "/api/v1/forward_backward":
        s, fut = _forward_backward(body, False)
        summary.update(s)
        return ok(fut)
    if p == "/api/v1/forward":
        return ok(_future("json", {"error": "forward is not traced", "category": "user"}))
    if p == "/api/v1/optim_step":
        return ok(_future("json", {"metrics": {}}, model_id=req["model_id"]))
    if p == "/api/v1/save_weights_for_sampler":
        mid = req["model_id"]
        if req.get("path"):
            return ok(
                _future(
                    "json",
                    {"type": "save_weights_for_sampler", "path": f"tinker://{mid}/sampler_weights/{req['path']}"},
                    model_id=mid,
                )
            )
        sid = f"{mid.split(':')[0]}:sample:{req['sampling_session_seq_id']}"
        _samplers[sid] = {"base_model": _models.get(mid, {}).get("base_model", ""), "model_path": None}
        return ok(_future("json", {"type": "save_weights_for_sampler", "sampling_session_id": sid}, model_id=mid))
    if p == "/api/v1/save_weights":
        mid = req["model_id"]
        return ok(
            _future("json", {"type": "save_weights", "path": f"tinker://{mid}/weights/{req['path']}"}, model_id=mid)
        )
    if p == "/api/v1/load_weights":
        if req.get("session_id") is not None:
            mid = f"{req['session_id']}:train:{req['model_seq_id']}"
            _models[mid] = {
                "base_model": req.get("base_model") or MODEL_NAME,
                "lora_config": {"rank": 8},
            }
        else:
            mid = req["model_id"]
        return ok(_future("json", {"type": "load_weights", "path": req["path"], "model_id": mid}, model_id=mid))
    if p == "/api/v1/create_sampling_session":
        sid = f"{req['session_id']}:sample:{req['sampling_session_seq_id']}"
        _samplers[sid] = {"base_model": req.get("base_model"), "model_path": req.get("model_path")}
        return ok({"type": "create_sampling_session", "sampling_session_id": sid})
    if p.startswith("/api/v1/samplers/"):
        sid = p.rsplit("/", 1)[-1]
        s = _samplers.get(sid, {"base_model": MODEL_NAME, "model_path": None})
        return ok(
            {
                "sampler_id": sid,
                "base_model": s["base_model"] or MODEL_NAME,
                "model_path": s["model_path"],
            }
        )
    if p == "/api/v1/asample":
        return ok(_sample(req))
    if p == "/api/v1/retrieve_future":
        with _lock:
            kind, payload = _futures.pop(
                req["request_id"], ("json", {"error": "unknown request_id", "category": "user"})
            )
        if kind == "proto":
            return 200, "application/x-protobuf", payload, summary, {"proto_bytes": len(payload)}
        return ok(payload)
    if p.startswith("/api/v1/sessions/") and p.endswith("/finish"):
        return ok({})
    return 404, "application/json", json.dumps({"detail": "not traced"}).encode(), summary, {"status": 404}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _handle(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        try:
            status, ctype, out, req_summary, reply = _route(self.path, self.headers, body)
        except Exception as e:  # a trace tool: report and answer 500
            status, ctype, out, req_summary, reply = (
                500,
                "application/json",
                json.dumps({"detail": repr(e)}).encode(),
                {},
                {"error": repr(e)},
            )
        _log(
            {
                "method": self.command,
                "path": self.path,
                "content_type": self.headers.get("Content-Type"),
                "accept": self.headers.get("Accept"),
                "api_key": bool(self.headers.get("X-API-Key")),
                "req": req_summary,
                "status": status,
                "reply": reply,
            }
        )
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = _handle

    def log_message(self, *args) -> None:  # the JSON log replaces the access log
        pass


def main() -> None:
    global _log_file
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--log", default="-", help="JSON-lines log file (default: stderr)")
    ap.add_argument("--model", default=MODEL_NAME, help="tokenizer for the canned replies")
    args = ap.parse_args()
    if args.log != "-":
        _log_file = open(args.log, "a")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    # canned replies: right for the first GSM8K question (72), a boxed wrong one, bare numbers
    for text in ["\\boxed{72}", "\\boxed{5}", "9", "42"]:
        _texts.append(tok.encode(text, add_special_tokens=False) + [_STOP_TOKEN])
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _Handler)
    print(f"trace_stub listening on http://127.0.0.1:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
