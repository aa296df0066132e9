"""The OpenEnv adapter (rlvr.envs.openenv) against a local server speaking openenv-core 0.3.0's HTTP protocol
(``POST /reset``, ``POST /step``; answers ``{"observation": {...}, "reward": ..., "done": ...}``), started in a
thread: driven directly, through the real turn loop (scripted engine, in-process runner, tiny model's renderer)
and through the environment process pool; and its failures: server down, a step that hangs, HTTP 500, not JSON."""

from __future__ import annotations

import json
import pickle
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlvr.envs.openenv import OpenEnv, OpenEnvError
from rlvr.envs.runner import InlineRunner, resolve_environment
from rlvr.envs.turns import TurnSettings, run_turns
from rlvr.types import SamplingConfig
from tests.unit.test_env_turns import ScriptedEngine, _start, ids, renderer  # noqa: F401 - a fixture


class Counter:
    """The server's environment: counts steps per episode (state keyed by episode_id); "7" wins; "hang" sleeps
    2 s; "drip" answers a byte every 0.1 s for 3 s; "crash" is an HTTP 500; "junk" answers a body that is not JSON."""

    def __init__(self) -> None:
        self.episodes: dict[str, int] = {}
        self.requests: list[tuple[str, dict]] = []


def make_handler(env: Counter):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def _answer(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up on a hanging step
                pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            env.requests.append((self.path, body))
            if self.path == "/reset":
                env.episodes[body["episode_id"]] = 0
                out = {"observation": {"prompt": "say a number", "count": 0}, "reward": None, "done": False}
                return self._answer(200, json.dumps(out).encode())
            if self.path != "/step":
                return self._answer(404, b'{"detail": "not found"}')
            msg = body["action"]["message"]
            if msg == "hang":
                time.sleep(2.0)
            if msg == "crash":
                return self._answer(500, b'{"detail": "the environment raised"}')
            if msg == "drip":  # an answer that keeps coming, a byte every 0.1 s for 3 s
                self.send_response(200)
                self.send_header("Content-Length", "30")
                self.end_headers()
                try:
                    for _ in range(30):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(0.1)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                return None
            if msg == "junk":
                return self._answer(200, b"<html>oops</html>")
            env.episodes[body["episode_id"]] += 1
            n = env.episodes[body["episode_id"]]
            out = {"observation": {"prompt": f"echo {msg} count {n}", "count": n},
                   "reward": 1.0 if msg == "7" else 0.0, "done": msg == "7"}
            return self._answer(200, json.dumps(out).encode())

    return Handler


@pytest.fixture(scope="module")
def server():
    env = Counter()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(env))
    srv.daemon_threads = True
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", env
    srv.shutdown()
    srv.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reply(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_the_adapter_speaks_the_protocol_and_keeps_its_episode_across_pickles(server):
    url, srv = server
    assert resolve_environment("openenv") is OpenEnv
    env = OpenEnv(url=url + "/", timeout_s=2, observation_field="prompt")
    n0 = len(srv.requests)
    assert env.reset({"gold": "7"}) == [{"role": "user", "content": "say a number"}]
    s = env.step([], reply("3"))
    assert (s.messages, s.reward, s.done) == ([{"role": "user", "content": "echo 3 count 1"}], 0.0, False)
    assert s.info == {"observation": "echo 3 count 1", "step": 1}
    env = pickle.loads(pickle.dumps(env))  # as the pool does between steps
    s = env.step([], reply("7"))
    assert (s.messages, s.reward, s.done) == ([], 1.0, True) and s.info["observation"] == "echo 7 count 2"
    eid = env.episode_id
    assert srv.requests[n0:] == [("/reset", {"episode_id": eid}),
                                 ("/step", {"action": {"message": "3"}, "episode_id": eid}),
                                 ("/step", {"action": {"message": "7"}, "episode_id": eid})]
    # the other mappings: the whole observation as JSON, the row's own opening, more action/reset keys, rescaling
    env = OpenEnv(url=url, opening="row", action_field="message", action_args={"lang": "en"},
                  reset_args={"seed": 3}, reward_range=[-1, 1])
    assert env.reset({}) is None and srv.requests[-1] == ("/reset", {"seed": 3, "episode_id": env.episode_id})
    s = env.step([], reply("5"))
    assert s.messages[0]["content"] == '{"count": 1, "prompt": "echo 5 count 1"}' and s.reward == 0.5
    assert srv.requests[-1][1]["action"] == {"lang": "en", "message": "5"}
    with pytest.raises(OpenEnvError, match=r"has no 'text' \(its keys: count, prompt\)"):
        OpenEnv(url=url, observation_field="text").reset({})
    for bad, why in (({"url": "localhost:1"}, "base URL"), ({"url": url, "timeout_s": 0}, "positive"),
                     ({"url": url, "opening": "x"}, "opening"), ({"url": url, "reward_range": [1, 1]}, "low < high")):
        with pytest.raises(ValueError, match=why):
            OpenEnv(**bad)


def test_failures_raise_with_the_reason_and_never_hang(server):
    url, _ = server
    env = OpenEnv(url=url, timeout_s=0.5, observation_field="prompt")
    env.reset({})
    t0 = time.monotonic()
    with pytest.raises(OpenEnvError, match=r"POST .*/step: no answer within timeout_s=0.5s"):
        env.step([], reply("hang"))
    assert time.monotonic() - t0 < 1.5
    t0 = time.monotonic()  # the deadline is the whole request's, not each read's
    with pytest.raises(OpenEnvError, match=r"POST .*/step: no answer within timeout_s=0.5s"):
        env.step([], reply("drip"))
    assert time.monotonic() - t0 < 1.5
    with pytest.raises(OpenEnvError, match=r"HTTP 500 .*the environment raised"):
        env.step([], reply("crash"))
    with pytest.raises(OpenEnvError, match=r"not JSON: b'<html>oops"):
        env.step([], reply("junk"))
    down = OpenEnv(url=f"http://127.0.0.1:{free_port()}", timeout_s=0.5)
    with pytest.raises(OpenEnvError, match="connection refused"):
        down.reset({})


def test_through_the_turn_loop_by_hand(renderer, server):  # noqa: F811
    url, _ = server
    start, conv = _start(renderer)
    args = {"url": url, "timeout_s": 1.0, "observation_field": "prompt"}
    rows = [{"gold": "7", "env": {"name": "openenv", "args": args}}]
    engine = ScriptedEngine(None, ["3", "7"])
    settings = TurnSettings(max_turns=5, max_tokens=200, max_new_tokens=8)
    (t,), counters = run_turns([start], [conv], 1, engine, InlineRunner(), renderer, settings,
                               SamplingConfig(n=1, max_new_tokens=8, seed=1), rows)
    assert (t.turns, t.end, t.turn_rewards) == (2, "done", [0.0, 1.0])
    assert t.messages == [{"role": "user", "content": "say a number"}, reply("3"),
                          {"role": "user", "content": "echo 3 count 1"}, reply("7")]
    opening = ids("<|im_start|>user\nsay a number<|im_end|>\n<|im_start|>assistant\n")
    between = ids("\n<|im_start|>user\necho 3 count 1<|im_end|>\n<|im_start|>assistant\n")
    assert t.seq.prompt_ids == opening  # the server's reset observation replaced the row's question
    assert t.seq.ids == ids("3") + [2] + between + ids("7") + [2]
    assert t.seq.mask == [1, 1] + [0] * len(between) + [1, 1]
    # failures end only the trajectory, with the reason
    for script, why in (("hang", "env: error: OpenEnvError: openenv: POST http://127.0.0.1:"),
                        ("crash", "env: error: OpenEnvError: openenv: POST")):
        (t,), counters = run_turns([start], [conv], 1, ScriptedEngine(None, [script]), InlineRunner(), renderer,
                                   settings, SamplingConfig(n=1, max_new_tokens=8), rows)
        assert t.end.startswith(why) and counters["env_failures"] == 1, t.end
    assert "no answer within timeout_s=1s" in run_turns(
        [start], [conv], 1, ScriptedEngine(None, ["hang"]), InlineRunner(), renderer, settings,
        SamplingConfig(n=1, max_new_tokens=8), rows)[0][0].end
    down = [{"gold": "7", "env": {"name": "openenv", "args": {**args, "url": f"http://127.0.0.1:{free_port()}"}}}]
    (t,), counters = run_turns([start], [conv], 1, ScriptedEngine(None, ["3"]), InlineRunner(), renderer, settings,
                               SamplingConfig(n=1, max_new_tokens=8), down)
    assert t.end.startswith("env: error: OpenEnvError: openenv: POST") and "/reset: connection refused" in t.end
    assert t.turns == 0 and counters["env_failures"] == 1


def test_through_the_process_pool(server):
    from rlvr.envs.pool import EnvPool

    url, _ = server
    row = {"gold": "7", "env": {"name": "openenv", "args": {"url": url, "timeout_s": 0.5,
                                                             "observation_field": "prompt"}}}
    with EnvPool(num_workers=2, timeout_s=5.0, memory_mb=2048) as pool:
        states = pool.reset([row] * 3)
        assert all(s is not None and op == [{"role": "user", "content": "say a number"}] for s, op in states), states
        out = pool.step([(s, [], reply(r)) for (s, _), r in zip(states, ["7", "hang", "3"])])
        assert out[0][1].done and out[0][1].reward == 1.0
        assert out[1][0] is None and "no answer within timeout_s=0.5s" in out[1][1]
        assert out[2][1].messages == [{"role": "user", "content": "echo 3 count 1"}]
