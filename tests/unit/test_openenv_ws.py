"""OpenEnv's WebSocket sessions (rlvr.envs.openenv.OpenEnvSession) against a real WebSocket server started in a
thread (websockets' sync server) that speaks openenv-core 0.3.0's ``/ws`` messages (``http_server.py`` line 1298:
``{"type": "reset"|"step"|"state"|"close", "data": ...}`` in, ``{"type": "observation"|"state"|"error", "data":
...}`` out), with one counter environment per connection: driven directly and through the environment process pool
(2 workers, several trajectories at once, each pinned to the worker that ran its reset); and its failures: an error
message, junk, a server that dies, a hung server, a pinned worker that was killed."""

from __future__ import annotations

import json
import os
import pickle
import threading
import time

import pytest

from rlvr.envs.openenv import _SESSIONS, OpenEnvError, OpenEnvSession, ws_url
from rlvr.envs.pool import EnvPool
from rlvr.envs.runner import UNPINNED, InlineRunner, resolve_environment
from tests.unit.test_openenv import free_port, reply

websockets_server = pytest.importorskip("websockets.sync.server")


class WsServer:
    """openenv-core's ``/ws`` endpoint in miniature. Per connection: ``reset`` sets the count to 0 and answers
    ``{"prompt": "say a number", "count": 0}``; a ``step`` with ``{"message": m}`` adds 1 and answers ``echo m count
    n`` (reward 1.0 and done on "7", else 0.0); ``state`` answers ``{"count": n, "episode_id": ...}``; ``close``
    is counted and ends the connection (no answer). Misbehaviour by message: "hang" sleeps 2 s first, "err" answers
    an error, "junk" answers text that is not JSON, "wrong" an answer of type state, "nodone" an observation that
    is not a dict, "die" drops the connection without a close frame."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.closes: dict[str, int] = {}
        self.log: list[tuple[str, dict]] = []  # (episode id of the connection, message)
        self.connections = 0
        self.paths: list[str] = []
        self.live: list = []
        self.max_sessions: int | None = None  # a server at capacity refuses the sessions past it
        self.active = 0
        self.srv = websockets_server.serve(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.srv.socket.getsockname()[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def handle(self, ws) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            self._serve(ws)
        except ConnectionClosed:  # the client gave up (a timeout) or went away (a killed worker)
            pass

    def _serve(self, ws) -> None:
        with self.lock:
            self.connections += 1
            self.paths.append(ws.request.path)
            self.live.append(ws)
            full = self.max_sessions is not None and self.active >= self.max_sessions
            self.active += not full
        if full:  # as openenv-core does at capacity (http_server.py line 1481): the error, then the close
            ws.send(json.dumps({"type": "error", "data": {"message": "Server at capacity: 1/1 sessions active.",
                                                          "code": "CAPACITY_REACHED"}}))
            return
        try:
            self._session(ws)
        finally:
            with self.lock:
                self.active -= 1

    def _session(self, ws) -> None:
        eid, count = None, 0
        for raw in ws:
            msg = json.loads(raw)
            if msg["type"] == "reset":
                eid = msg["data"].get("episode_id")
            with self.lock:
                self.log.append((eid, msg))
            if msg["type"] == "close":
                with self.lock:
                    self.closes[eid] = self.closes.get(eid, 0) + 1
                return
            if msg["type"] == "state":
                ws.send(json.dumps({"type": "state", "data": {"count": count, "episode_id": eid}}))
                continue
            if msg["type"] == "reset":
                count = 0
                data = {"observation": {"prompt": "say a number", "count": 0}, "reward": None, "done": False}
                ws.send(json.dumps({"type": "observation", "data": data}))
                continue
            m = msg["data"]["message"]
            if m == "hang":
                time.sleep(2.0)
            if m == "err":
                ws.send(json.dumps({"type": "error", "data": {"message": "step() raised KeyError('x')",
                                                              "code": "EXECUTION_ERROR"}}))
                continue
            if m == "junk":
                ws.send("<html>oops</html>")
                continue
            if m == "wrong":
                ws.send(json.dumps({"type": "state", "data": {}}))
                continue
            if m == "nodone":
                ws.send(json.dumps({"type": "observation", "data": {"observation": "text"}}))
                continue
            if m == "die":
                ws.close_socket()
                return
            count += 1
            data = {"observation": {"prompt": f"echo {m} count {count}", "count": count},
                    "reward": 1.0 if m == "7" else 0.0, "done": m == "7"}
            ws.send(json.dumps({"type": "observation", "data": data}))

    def kill(self) -> None:
        """The whole server goes away: no more connections, every live one dropped without a close frame."""
        self.srv.shutdown()
        for ws in self.live:
            ws.close_socket()

    def steps_of(self, eid: str) -> list[dict]:
        return [m["data"] for e, m in self.log if e == eid and m["type"] == "step"]


@pytest.fixture()
def server():
    srv = WsServer()
    yield srv
    srv.kill()


def _wait(cond, what: str, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


def row(url: str, **args) -> dict:
    return {"gold": "7", "env": {"name": "openenv_ws", "args": {"url": url, "timeout_s": 0.5,
                                                               "observation_field": "prompt", **args}}}


def test_one_session_keeps_its_state_on_its_connection_and_closes_once(server):
    assert resolve_environment("openenv_ws") is OpenEnvSession and OpenEnvSession.sticky is True
    assert ws_url("http://h:1/") == "ws://h:1/ws" and ws_url("https://h") == "wss://h/ws"
    assert ws_url("ws://h:1") == "ws://h:1/ws"
    env = OpenEnvSession(url=server.url, timeout_s=2, observation_field="prompt", reset_args={"seed": 3})
    assert env.reset({}) == [{"role": "user", "content": "say a number"}]
    eid = env.episode_id
    assert server.paths == ["/ws"] and eid in _SESSIONS
    s = env.step([], reply("3"))
    assert (s.messages, s.reward, s.done) == ([{"role": "user", "content": "echo 3 count 1"}], 0.0, False)
    env = pickle.loads(pickle.dumps(env))  # as a worker does between steps: only the id and settings travel
    assert "_SESSIONS" not in str(vars(env)) and set(vars(env)) >= {"episode_id", "url", "ws_url"}
    s = env.step([], reply("5"))
    assert s.messages == [{"role": "user", "content": "echo 5 count 2"}] and s.info == {
        "observation": "echo 5 count 2", "step": 2}
    assert env.server_state() == {"count": 2, "episode_id": eid}
    s = env.step([], reply("7"))
    assert (s.messages, s.reward, s.done) == ([], 1.0, True)
    assert [m for e, m in server.log if e == eid] == [
        {"type": "reset", "data": {"seed": 3, "episode_id": eid}},
        {"type": "step", "data": {"message": "3"}}, {"type": "step", "data": {"message": "5"}},
        {"type": "state"}, {"type": "step", "data": {"message": "7"}}]
    env.close()
    _wait(lambda: server.closes.get(eid) == 1, "the close message")
    assert eid not in _SESSIONS
    env.close()  # a second close has nothing left to close
    time.sleep(0.1)
    assert server.closes == {eid: 1} and server.connections == 1
    # the same mapping code as the HTTP path: rescaling and the whole observation as JSON
    env = OpenEnvSession(url=server.url.replace("http", "ws"), reward_range=[-1, 1])
    env.reset({})
    first = env.episode_id
    env.reset({})  # a second reset of one object: a new session, the first one's connection dropped
    assert first not in _SESSIONS and env.episode_id in _SESSIONS and server.connections == 3
    s = env.step([], reply("7"))
    assert s.reward == 1.0 and s.info["observation"] == '{"count": 1, "prompt": "echo 7 count 1"}'
    env.close()
    for bad, why in (({"url": "localhost:1"}, "base URL"), ({"url": server.url, "timeout_s": 0}, "positive")):
        with pytest.raises(ValueError, match=why):
            OpenEnvSession(**bad)


@pytest.mark.parametrize("message, why", [
    ("err", r"step: the server answered an error: step\(\) raised KeyError\('x'\) \(code: EXECUTION_ERROR\)"),
    ("junk", r"step: the answer is not JSON: '<html>oops</html>'"),
    ("wrong", r"step: answered \"\{'type': 'state', 'data': \{\}\}\"; expected \{\"type\": \"observation\""),
    ("nodone", r" step answered \"\{'observation': 'text'\}\"; expected \{\"observation\": \{...\}, \"reward\""),
    ("die", r"step: the server closed the connection"),
])
def test_each_failure_names_the_url_and_what_happened_and_drops_the_session(server, message, why):
    env = OpenEnvSession(url=server.url, timeout_s=1.0, observation_field="prompt")
    env.reset({})
    eid = env.episode_id
    with pytest.raises(OpenEnvError, match=f"openenv: ws://127.0.0.1:{server.url.rsplit(':', 1)[1]}/ws.*{why}"):
        env.step([], reply(message))
    assert eid not in _SESSIONS  # what the connection would answer next is unknown: it is dropped
    with pytest.raises(OpenEnvError, match=f"no live session for episode {eid} in this worker process "
                                           f"\\(pid {os.getpid()}\\)"):
        env.step([], reply("3"))
    env.close()  # nothing to close: the failure did (politely after an error answer, the connection in step)
    time.sleep(0.1)
    assert server.closes == ({eid: 1} if message == "err" else {})


def test_a_hung_server_times_out_and_a_server_that_is_down_is_refused(server):
    before = set(_SESSIONS)
    env = OpenEnvSession(url=server.url, timeout_s=0.5, observation_field="prompt")
    env.reset({})
    t0 = time.monotonic()
    with pytest.raises(OpenEnvError, match=r"/ws: step: no answer within timeout_s=0.5s"):
        env.step([], reply("hang"))
    assert time.monotonic() - t0 < 1.2
    with pytest.raises(OpenEnvError, match=r"ws://127.0.0.1:\d+/ws: connection refused"):
        OpenEnvSession(url=f"http://127.0.0.1:{free_port()}", timeout_s=0.5).reset({})
    # a server at capacity: its error (sent before it closed the connection) is the reason
    _wait(lambda: server.active == 0, "the hung step's session to end on the server")
    server.max_sessions = 1
    env.reset({})
    full = r"reset: the server answered an error{}: Server at capacity: 1/1 sessions active. \(code: CAPACITY_REACHED\)"
    with pytest.raises(OpenEnvError, match=full.format("( and closed the connection)?")):
        OpenEnvSession(url=server.url, timeout_s=0.5).reset({})  # the reset sent before or after the close
    late = OpenEnvSession(url=server.url, timeout_s=0.5)  # after: the error is read from what came before the close
    late.episode_id = "late"
    _SESSIONS["late"] = late._connect()
    _wait(lambda: server.connections == 4, "the refused connection")
    time.sleep(0.2)
    with pytest.raises(OpenEnvError, match=full.format(" and closed the connection")):
        late._call("reset", {})
    env.close()
    # an HTTP server that does not speak WebSocket: the upgrade is refused with its status
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class NotFound(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # websockets reads an HTTP/1.1 status line only

        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_error(404)

    http = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        with pytest.raises(OpenEnvError, match=r"refused the WebSocket upgrade: HTTP 404 \(does it serve /ws"):
            OpenEnvSession(url=f"http://127.0.0.1:{http.server_address[1]}", timeout_s=0.5).reset({})
    finally:
        http.shutdown()
        http.server_close()
    # a listener that never answers the handshake: the connect has the deadline too
    import socket

    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(1)
        t0 = time.monotonic()
        with pytest.raises(OpenEnvError, match=r"no connection within timeout_s=0.5s"):
            OpenEnvSession(url=f"http://127.0.0.1:{mute.getsockname()[1]}", timeout_s=0.5).reset({})
        assert time.monotonic() - t0 < 1.2
    assert set(_SESSIONS) == before  # the timed-out session was dropped; the failed connects kept nothing


def _mute_after_reset() -> tuple[str, threading.Event]:
    """A bare WebSocket server (RFC 6455 by hand) that answers the handshake and one reset, then neither reads
    nor answers anything (not even a close frame): what only the client's deadlines can end."""
    import base64
    import hashlib
    import socket

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    done = threading.Event()

    def run():
        conn, _ = lsock.accept()
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(4096)
        key = [ln.split(b":", 1)[1].strip() for ln in head.split(b"\r\n")
               if ln.lower().startswith(b"sec-websocket-key")][0]
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        conn.recv(4096)  # the reset
        body = json.dumps({"type": "observation", "data": {"observation": {"p": "x"}, "done": False}}).encode()
        conn.sendall(bytes([0x81, len(body)]) + body)  # one unmasked text frame (< 126 bytes)
        done.wait(10)
        conn.close()
        lsock.close()

    threading.Thread(target=run, daemon=True).start()
    return f"http://127.0.0.1:{lsock.getsockname()[1]}", done


def test_close_ends_within_timeout_s_when_the_server_goes_silent():
    url, done = _mute_after_reset()
    env = OpenEnvSession(url=url, timeout_s=0.5)
    env.reset({})
    t0 = time.monotonic()
    env.close()  # the wait for the server's close and the close handshake share one timeout_s
    took = time.monotonic() - t0
    done.set()
    assert 0.45 < took < 0.8, took


def test_through_the_pool_each_trajectory_stays_on_its_worker_and_its_connection(server):
    with EnvPool(num_workers=2, timeout_s=5.0, memory_mb=2048) as pool:
        states = pool.reset([row(server.url)] * 4)
        assert [op for _, op in states] == [[{"role": "user", "content": "say a number"}]] * 4, states
        slots = [s[3] for s, _ in states]
        assert set(slots) <= {0, 1} and UNPINNED not in slots
        eids = [pickle.loads(s[1]).episode_id for s, _ in states]
        assert len(set(eids)) == 4 and server.connections == 4
        out = pool.step([(s, [], reply(f"{i}")) for i, (s, _) in enumerate(states)])
        assert [st[3] for st, _ in out] == slots  # the pin travels with the state
        assert [step.messages[0]["content"] for _, step in out] == [f"echo {i} count 1" for i in range(4)]
        out = pool.step([(st, [], reply(f"{i}{i}")) for i, (st, _) in enumerate(out)])
        assert [step.messages[0]["content"] for _, step in out] == [f"echo {i}{i} count 2" for i in range(4)]
        assert [step.reward for _, step in out] == [0.0] * 4
        for i, eid in enumerate(eids):  # each connection saw its own trajectory's steps, in order
            assert server.steps_of(eid) == [{"message": f"{i}"}, {"message": f"{i}{i}"}]
        # both workers were idle: reset 0 went to slot 0, reset 1 to slot 1. Trajectory 1's close goes first, so
        # only its pin keeps it off slot 0 (the first idle worker), where its connection is not
        assert slots[:2] == [0, 1]
        pool.release([out[1][0], out[0][0], out[2][0], out[3][0]])
        _wait(lambda: len(server.closes) == 4, "four close messages")
        assert server.closes == {eid: 1 for eid in eids}
        assert pool.stats()["close_errors"] == 0 and pool.stats()["crashes"] == 0


def test_through_the_pool_failures_end_only_their_trajectory_and_never_score(server):
    with EnvPool(num_workers=2, timeout_s=5.0, memory_mb=2048) as pool:
        states = pool.reset([row(server.url)] * 3)
        eids = [pickle.loads(s[1]).episode_id for s, _ in states]
        t0 = time.monotonic()
        out = pool.step([(s, [], reply(r)) for (s, _), r in zip(states, ["hang", "err", "3"])])
        assert time.monotonic() - t0 < 2.5
        assert out[0][0] is None and out[0][1].startswith("error: OpenEnvError: openenv: ws://127.0.0.1:")
        assert "step: no answer within timeout_s=0.5s" in out[0][1].splitlines()[0]
        assert out[1][0] is None and "(code: EXECUTION_ERROR)" in out[1][1].splitlines()[0]
        assert out[2][1].messages == [{"role": "user", "content": "echo 3 count 1"}]
        # the turn loop releases a failed trajectory's last good state: nothing live is left to close for it
        pool.release([states[0][0], states[1][0], out[2][0]])
        _wait(lambda: eids[2] in server.closes, "the close of the trajectory that went on")
        time.sleep(0.1)  # the error answer's session was closed at the error, the timed-out one dropped
        assert server.closes == {eids[1]: 1, eids[2]: 1} and pool.stats()["close_errors"] == 0
        # a server that dies mid-trajectory: the next step is an environment error, never a reward
        states = pool.reset([row(server.url)] * 2)
        server.kill()
        out = pool.step([(s, [], reply("3")) for s, _ in states])
        for st, why in out:
            assert st is None and why.startswith("error: OpenEnvError: openenv: ws://127.0.0.1:")
            assert "step: the server closed the connection" in why.splitlines()[0], why
        out = pool.reset([row(server.url)])
        assert out[0][0] is None and "/ws: connection refused" in out[0][1].splitlines()[0]


def test_a_killed_pinned_worker_loses_its_sessions_with_a_clear_error(server):
    with EnvPool(num_workers=2, timeout_s=5.0, memory_mb=2048) as pool:
        states = []
        while len({s[3] for s, _ in states}) < 2:  # trajectories on both workers (the free ones take any)
            states += pool.reset([row(server.url)] * 2)
        doomed = states[0][0][3]
        worker = pool._pool._workers[doomed]
        worker.proc.kill()
        worker.proc.join(5)
        out = pool.step([(s, [], reply("3")) for s, _ in states])
        for (s, _), (st, why) in zip(states, out):
            eid = pickle.loads(s[1]).episode_id
            if s[3] == doomed:
                assert st is None and why.startswith("error: OpenEnvError: openenv: ws://127.0.0.1:"), why
                assert f"no live session for episode {eid} in this worker process" in why
                assert "which was replaced (it died, or was killed at environment.timeout_s)" in why
            else:
                assert why.messages == [{"role": "user", "content": "echo 3 count 1"}]
        assert pool.stats()["restarts"] == 1
        # the replacement has the slot and runs the lost sessions' close quietly (nothing live to close there)
        pool.release([st if st is not None else s for (s, _), (st, _) in zip(states, out)])
        alive = [pickle.loads(s[1]).episode_id for s, _ in states if s[3] != doomed]
        _wait(lambda: len(server.closes) == len(alive), "the closes of the live sessions")
        assert server.closes == {eid: 1 for eid in alive} and pool.stats()["close_errors"] == 0


def test_a_step_past_the_pools_limit_kills_the_worker_and_its_close_runs_in_the_replacement(server):
    with EnvPool(num_workers=1, timeout_s=1.0, memory_mb=2048) as pool:
        (s, _), = pool.reset([row(server.url, timeout_s=5.0)])
        pid = pool._pool._workers[0].proc.pid
        (st, why), = pool.step([(s, [], reply("hang"))])
        assert st is None and why.startswith("timeout\nthe call ran past environment.timeout_s=1 s")
        pool.release([s])
        assert pool._pool._workers[0].proc.pid != pid and pool.stats()["close_errors"] == 0
        (s2, _), = pool.reset([row(server.url)])  # the replacement serves new sessions
        (_, step), = pool.step([(s2, [], reply("7"))])
        assert (step.reward, step.done) == (1.0, True)


def test_the_inline_runner_keeps_sessions_in_this_process(server):
    runner = InlineRunner()
    (s, op), = runner.reset([row(server.url)])
    assert s[3] == UNPINNED and op == [{"role": "user", "content": "say a number"}]
    (s, step), = runner.step([(s, [], reply("4"))])
    assert step.messages == [{"role": "user", "content": "echo 4 count 1"}]
    eid = pickle.loads(s[1]).episode_id
    runner.release([s])
    _wait(lambda: server.closes == {eid: 1}, "the close")


_VM_PROBE = """
import re, sys
from rlvr.envs.openenv import OpenEnvSession
def vm():
    return int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024
envs, sizes = [], []
for i in range(33):
    envs.append(OpenEnvSession(url=sys.argv[1], timeout_s=5.0))
    envs[-1].reset({})
    sizes.append(vm())
for e in envs:
    e.close()
print(sizes[1] - sizes[0], (sizes[32] - sizes[1]) / 31)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmSize from /proc")
def test_each_session_costs_little_address_space(server):
    """A connection's reader thread gets a 512 KiB stack (not 8 MiB) and no malloc arena of its own (64 MiB of
    address space each, up to 8 per core): what environment.memory_mb counts. Measured in a fresh process: the
    second session and the next 31 each add under 2 MiB of VmSize."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _VM_PROBE, server.url], capture_output=True, text=True, timeout=60,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert r.returncode == 0, r.stderr[-2000:]
    second, each = map(float, r.stdout.split())
    assert second < 2 and each < 2, (second, each)
    assert server.closes and len(server.closes) == 33


def test_a_worker_under_its_memory_limit_holds_many_sessions(server):
    """Each connection has a reader thread: with 8 MiB stacks and a malloc arena per thread (64 MiB of address space
    each, up to 8 per core) a worker at memory_mb=2048 on 2 cores held 16 sessions; with small stacks and 2 arenas,
    over a thousand. 64 here, in one worker."""
    with EnvPool(num_workers=1, timeout_s=20.0, memory_mb=2048) as pool:
        out = pool.reset([row(server.url, timeout_s=5.0)] * 64)
        assert [why.splitlines()[0] for s, why in out if s is None] == []
        out = pool.step([(s, [], reply("1")) for s, _ in out])
        assert {step.messages[0]["content"] for _, step in out} == {"echo 1 count 1"}
        pool.release([s for s, _ in out])
        _wait(lambda: len(server.closes) == 64, "64 closes")
