"""The things the conformance suite (tests/unit/test_env_conformance.py) puts behind each adapter, each able to
misbehave on purpose (``mode``):

- ``ok``: opens with ``OPENING``; a reply ``"7"`` wins (reward 1, done), any other reply gets ``"again"`` back;
- ``reset_raises``: the reset raises ``RuntimeError("reset broke")``;
- ``step_raises``: the first step raises ``RuntimeError("step broke")``;
- ``step_hangs``: the first step sleeps 60 s (past every limit the suite sets);
- ``dies``: the first step kills what serves the environment (the worker process with ``os._exit``; a server
  stops listening);
- ``malformed``: the first step answers garbage the adapter must refuse (a reward of 5, a body that is not JSON);
- ``long_obs``: the first step answers an observation of ``LONG_CHARS`` characters, then play goes on.

A plain rlvr environment (:class:`PlainEnv`), a TextArena game (:class:`ArenaGame`, played through rlvr's
``textarena`` adapter as ``game: tests/unit/conformance_envs.py:ArenaGame``) and an OpenEnv HTTP server
(:class:`OpenEnvServer`). ``closes_to``: a file each ``close()`` appends a line to (what the suite counts).
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rlvr.envs.base import EnvStep

OPENING = "say a number"
LONG_CHARS = 200_000
HANG_S = 60.0


def _note(path: str | None, text: str) -> None:
    if path:
        with open(path, "a") as f:
            f.write(text + "\n")


def misbehave(mode: str) -> None:
    """What an in-process environment does at its first step in ``step_raises``, ``step_hangs`` and ``dies``
    (nothing in the other modes)."""
    if mode == "step_raises":
        raise RuntimeError("step broke")
    if mode == "step_hangs":
        time.sleep(HANG_S)
    if mode == "dies":
        os._exit(3)


class PlainEnv:
    """A plain rlvr environment in ``mode`` (the module docstring)."""

    def __init__(self, mode: str = "ok", closes_to: str | None = None) -> None:
        self.mode, self.closes_to, self.steps = mode, closes_to, 0

    def reset(self, row: dict[str, Any]):
        if self.mode == "reset_raises":
            raise RuntimeError("reset broke")
        return [{"role": "user", "content": OPENING}]

    def step(self, history, reply):
        self.steps += 1
        if self.steps == 1 and self.mode != "ok":
            misbehave(self.mode)
            if self.mode == "malformed":
                return EnvStep([{"role": "user", "content": "x"}], reward=5.0)
            if self.mode == "long_obs":
                return EnvStep([{"role": "user", "content": "z" * LONG_CHARS}])
        if reply["content"].strip() == "7":
            return EnvStep([], reward=1.0, done=True)
        return EnvStep([{"role": "user", "content": "again"}], reward=0.0)

    def close(self) -> None:
        _note(self.closes_to, f"closed after {self.steps} steps")


def _arena_prompt(player_id: int, game_state: dict) -> str:
    return OPENING


try:
    import textarena as ta

    class ArenaGame(ta.Env):
        """A one-player TextArena game in ``mode``: ``[7]`` wins (reward 1); any other bracketed number is answered
        "again"; a reply without a bracketed number is an invalid move (TextArena's own handling: a message and one
        more try, then the game is lost, reward -1)."""

        def __init__(self, mode: str = "ok") -> None:
            self.mode, self.steps = mode, 0

        def reset(self, num_players: int, seed: int | None = None):
            if self.mode == "reset_raises":
                raise RuntimeError("reset broke")
            self.state = ta.SinglePlayerState(num_players=num_players, seed=seed, max_turns=50)
            self.state.reset(game_state={}, player_prompt_function=_arena_prompt)

        def step(self, action: str):
            import re

            self.steps += 1
            self.state.add_observation(from_id=0, to_id=-1, message=action,
                                       observation_type=ta.ObservationType.PLAYER_ACTION)
            if self.steps == 1 and self.mode != "ok":
                misbehave(self.mode)
                if self.mode == "malformed":
                    self.state.rewards = {0: "a lot"}  # not a number: the adapter must refuse it
                    self.state.done = True
                    return self.state.step()
                if self.mode == "long_obs":
                    self.state.add_observation(message="z" * LONG_CHARS, observation_type=ta.ObservationType.GAME_MESSAGE)
                    return self.state.step()
            m = re.search(r"\[(\d+)\]", action)
            if m is None:
                self.state.set_invalid_move(reason="no bracketed number")
            elif m.group(1) == "7":
                self.state.set_outcome(reward=1, reason="seven")
            else:
                self.state.add_observation(message="again", observation_type=ta.ObservationType.GAME_MESSAGE)
            return self.state.step()
except ImportError:  # pragma: no cover - textarena is in the envs extra, installed by scripts/setup.sh
    pass


class OpenEnvServer:
    """An HTTP server speaking openenv-core 0.3.0's protocol (``POST /reset``, ``POST /step``) in a thread; its
    ``mode`` (the module docstring) is set per episode by the reset body's ``mode`` (the adapter's
    ``reset_args``). ``dies`` stops the server at the first step. ``url``: its address."""

    def __init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, code: int, body: bytes) -> None:
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/reset":
                    mode = body.get("mode", "ok")
                    if mode == "reset_raises":
                        return self._answer(500, b'{"detail": "reset broke"}')
                    server.episodes[body["episode_id"]] = [mode, 0]
                    return self._answer(200, json.dumps({"observation": {"text": OPENING}, "reward": None,
                                                         "done": False}).encode())  # fmt: skip
                ep = server.episodes[body["episode_id"]]
                ep[1] += 1
                mode, n = ep
                if n == 1 and mode != "ok":
                    if mode == "step_raises":
                        return self._answer(500, b'{"detail": "step broke"}')
                    if mode == "step_hangs":
                        server.stopping.wait(HANG_S)  # until the test is over
                    if mode == "dies":
                        threading.Thread(target=server.stop, daemon=True).start()
                        self.close_connection = True
                        return None
                    if mode == "malformed":
                        return self._answer(200, b"<html>oops</html>")
                    if mode == "long_obs":
                        return self._answer(200, json.dumps({"observation": {"text": "z" * LONG_CHARS},
                                                             "reward": None, "done": False}).encode())  # fmt: skip
                won = body["action"]["message"].strip() == "7"
                out = {"observation": {"text": "won" if won else "again"}, "reward": 1.0 if won else 0.0, "done": won}
                return self._answer(200, json.dumps(out).encode())

        self.episodes: dict[str, list] = {}
        self.stopping = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class OpenEnvWsServer:
    """openenv-core 0.3.0's ``/ws`` sessions in miniature (one connection, one episode), in a thread: the reset
    data's ``mode`` (the adapter's ``reset_args``) picks the mode for the session; each ``close`` message is noted in
    the reset data's ``closes_to``. ``dies`` drops every connection and stops listening at the first step."""

    def __init__(self) -> None:
        from websockets.sync.server import serve

        self.live: list = []
        self.stopping = threading.Event()
        self.srv = serve(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.srv.socket.getsockname()[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def _send(self, ws, kind: str, data: Any) -> None:
        ws.send(json.dumps({"type": kind, "data": data}))

    def _handle(self, ws) -> None:
        from websockets.exceptions import ConnectionClosed

        self.live.append(ws)
        mode, closes_to, n = "ok", None, 0
        try:
            for raw in ws:
                msg = json.loads(raw)
                if msg["type"] == "close":
                    _note(closes_to, f"closed after {n} steps")
                    return
                if msg["type"] == "reset":
                    mode, closes_to = msg["data"].get("mode", "ok"), msg["data"].get("closes_to")
                    if mode == "reset_raises":
                        self._send(ws, "error", {"message": "reset broke", "code": "EXECUTION_ERROR"})
                        continue
                    self._send(ws, "observation", {"observation": {"text": OPENING}, "reward": None, "done": False})
                    continue
                n += 1
                if n == 1 and mode != "ok":
                    if mode == "step_raises":
                        self._send(ws, "error", {"message": "step broke", "code": "EXECUTION_ERROR"})
                        continue
                    if mode == "step_hangs":
                        self.stopping.wait(HANG_S)  # until the test is over
                    if mode == "dies":
                        threading.Thread(target=self.stop, daemon=True).start()
                        ws.close_socket()
                        return
                    if mode == "malformed":
                        ws.send("<html>oops</html>")
                        continue
                    if mode == "long_obs":
                        self._send(ws, "observation", {"observation": {"text": "z" * LONG_CHARS}, "reward": None,
                                                       "done": False})  # fmt: skip
                        continue
                won = msg["data"]["message"].strip() == "7"
                self._send(ws, "observation", {"observation": {"text": "won" if won else "again"},
                                               "reward": 1.0 if won else 0.0, "done": won})  # fmt: skip
        except ConnectionClosed:
            pass

    def stop(self) -> None:
        self.stopping.set()
        for ws in self.live:  # first: shutdown() waits for the handlers, which wait for their connections
            ws.close_socket()
        self.srv.shutdown()
