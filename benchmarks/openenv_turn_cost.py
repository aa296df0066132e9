"""What an OpenEnv turn costs over WebSocket sessions (``openenv_ws``) against HTTP (``openenv``), through the
environment pool as training runs them (issue 42).

One local echo server in this process speaks both transports of openenv-core 0.3.0 (HTTP ``POST /reset|/step``;
WebSocket ``/ws`` with ``{"type": "reset"|"step"|"close", ...}``), each answering ``echo <message> count n`` with a
per-episode (HTTP: keyed by ``episode_id``) or per-connection (WS) counter. B trajectories play K steps through
:class:`rlvr.envs.pool.EnvPool` (``--workers`` processes; no engine: fixed replies); the wall time of each round (one
``pool.step`` over the B trajectories, what the turn loop waits for) is measured, and of the reset and the close
(``release``) rounds. Over HTTP each step is a new TCP connection and request; over WS one message on the
trajectory's open connection, in the worker that holds it (pinned, so a round's B steps spread over the workers only
as the resets did).

Prints per transport the median round (ms), the median per trajectory-step (round / B), the reset and close rounds,
and the ratio ws/http measured in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/openenv_turn_cost.py [--trajectories 8] [--steps 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlvr.envs.pool import EnvPool  # noqa: E402


def _observation(msg: str, n: int) -> dict:
    return {"observation": {"prompt": f"echo {msg} count {n}", "count": n}, "reward": 0.0, "done": False}


def serve_http() -> tuple[str, ThreadingHTTPServer]:
    counts: dict[str, int] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            eid = body["episode_id"]
            if self.path == "/reset":
                counts[eid] = 0
                out = _observation("", 0)
            else:
                counts[eid] += 1
                out = _observation(body["action"]["message"], counts[eid])
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}", srv


def serve_ws():
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.server import serve

    def handle(ws):
        count = 0
        try:
            for raw in ws:
                msg = json.loads(raw)
                if msg["type"] == "close":
                    return
                if msg["type"] == "reset":
                    count, out = 0, _observation("", 0)
                else:
                    count += 1
                    out = _observation(msg["data"]["message"], count)
                ws.send(json.dumps({"type": "observation", "data": out}))
        except ConnectionClosed:
            pass

    srv = serve(handle, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.socket.getsockname()[1]}", srv


def play(pool: EnvPool, name: str, url: str, b: int, k: int) -> dict[str, list[float]]:
    """One game of B trajectories for K steps; the wall time (ms) of each round."""
    row = {"env": {"name": name, "args": {"url": url, "timeout_s": 5.0, "observation_field": "prompt"}}}
    t0 = time.perf_counter()
    states = [s for s, _ in pool.reset([row] * b)]
    times = {"reset": [(time.perf_counter() - t0) * 1e3], "step": [], "close": []}
    assert all(s is not None for s in states), "a reset failed"
    for i in range(k):
        t0 = time.perf_counter()
        out = pool.step([(s, [], {"role": "assistant", "content": str(i)}) for s in states])
        times["step"].append((time.perf_counter() - t0) * 1e3)
        assert all(st is not None for st, _ in out), [why for st, why in out if st is None]
        assert out[0][1].messages[0]["content"] == f"echo {i} count {i + 1}", out[0][1].messages
        states = [st for st, _ in out]
    t0 = time.perf_counter()
    pool.release(states)
    times["close"].append((time.perf_counter() - t0) * 1e3)
    assert pool.stats()["close_errors"] == 0
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trajectories", type=int, default=8, help="B: trajectories stepped together")
    ap.add_argument("--steps", type=int, default=20, help="K: steps per trajectory")
    ap.add_argument("--repeats", type=int, default=3, help="games per transport (interleaved)")
    ap.add_argument("--workers", type=int, default=2, help="environment.num_workers")
    a = ap.parse_args()
    http_url, http_srv = serve_http()
    ws_url, ws_srv = serve_ws()
    runs = {"openenv": ("openenv", http_url), "openenv_ws": ("openenv_ws", ws_url)}
    got: dict[str, dict[str, list[float]]] = {n: {"reset": [], "step": [], "close": []} for n in runs}
    with EnvPool(num_workers=a.workers, timeout_s=10.0, memory_mb=2048) as pool:
        play(pool, "openenv", http_url, 2, 2)  # warm the workers' imports
        play(pool, "openenv_ws", ws_url, 2, 2)
        for _ in range(a.repeats):
            for label, (name, url) in runs.items():
                for key, vals in play(pool, name, url, a.trajectories, a.steps).items():
                    got[label][key] += vals
    http_srv.shutdown()
    ws_srv.shutdown()
    med = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in got.items()}
    b = a.trajectories
    print(f"B={b} trajectories x K={a.steps} steps, {a.repeats} games each, {a.workers} environment workers")
    print(f"{'transport':<12} {'step round ms':>14} {'per traj-step ms':>17} {'reset round ms':>15} "
          f"{'close round ms':>15}")
    for n, m in med.items():
        print(f"{n:<12} {m['step']:>14.2f} {m['step'] / b:>17.3f} {m['reset']:>15.2f} {m['close']:>15.2f}")
    print(f"ratio ws/http: step {med['openenv_ws']['step'] / med['openenv']['step']:.2f}, "
          f"reset {med['openenv_ws']['reset'] / med['openenv']['reset']:.2f} (http has no close: its close round "
          "is the pool's release with nothing to do)")

if __name__ == "__main__":
    main()
