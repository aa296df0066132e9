"""An OpenEnv environment (https://github.com/meta-pytorch/OpenEnv) served over HTTP, run as an rlvr environment.

The protocol, as openenv-core 0.3.0's server speaks it (``openenv/core/env_server/http_server.py``, ``types.py``,
``serialization.py``):

- ``POST {url}/reset`` with a JSON body ``{"seed"?: int, "episode_id"?: str, ...}`` (extra keys are passed to the
  environment's ``reset`` when it takes them) answers ``{"observation": {...}, "reward": float|null, "done": bool}``;
- ``POST {url}/step`` with ``{"action": {...}, "timeout_s"?: float, ...}`` answers the same shape (422 for an action
  the environment's schema rejects);
- ``observation`` is the environment's Observation model without ``reward``/``done``/``metadata``.

rlvr sends the assistant's reply as ``{"action": {action_field: text, **action_args}}`` and turns the observation into
a user message: its ``observation_field`` when given (a string, or JSON of anything else), else the whole
observation as JSON. ``reward``/``done`` pass through (a reward must lie in [0, 1]: rescale with ``reward_range``).
``reset`` opens the trajectory with the reset observation (``opening: observation``) or with the row's own prompt
(``opening: row``).

State: every request of a trajectory carries the same ``episode_id`` (made at reset), and nothing else travels:
the object is pickled between steps like any rlvr environment. openenv-core's own HTTP server builds a fresh
environment for each ``/reset`` and ``/step`` request (its stateful sessions are the WebSocket ``/ws`` endpoint,
which :class:`OpenEnvSession` speaks), so state across steps lives in the server: an environment that keys its state
by ``episode_id`` (``step(action, episode_id=...)`` receives it: the server passes extra body keys an environment's
``step`` accepts), or a server that shares one environment (one trajectory at a time).

WebSocket sessions (:class:`OpenEnvSession`, short name ``openenv_ws``), as openenv-core 0.3.0 speaks them
(``http_server.py`` ``websocket_endpoint``, ``/ws``, line 1298; ``env_client.py`` ``reset``/``step``/``close``,
lines 372-421; ``types.py`` ``WSResetMessage``... lines 248-314): one connection is one environment instance on the
server. Text messages ``{"type": "reset", "data": {reset keys}}``, ``{"type": "step", "data": {the action}}`` (the
action itself, not wrapped: ``deserialize_action(msg.data, ...)``), ``{"type": "state"}``, ``{"type": "close"}`` (no
answer: the server ends the session); answers ``{"type": "observation", "data": {"observation": {...}, "reward": ...,
"done": ...}}`` (the HTTP answer's shape), ``{"type": "state", "data": {...}}`` or ``{"type": "error", "data":
{"message": ..., "code": ...}}``. The connection lives in the worker process that ran the reset (a module-level
dict, :data:`_SESSIONS`, keyed by the episode id); only the episode id and the settings are pickled. The class is
``sticky``, so :class:`rlvr.envs.pool.EnvPool` runs its steps and ``close`` in that worker; a replaced worker (dead,
or killed at ``environment.timeout_s``) has no connection, and the step raises "no live session".

Errors: every request has a total deadline of ``timeout_s``; a refused connection, a timeout, an HTTP error status,
a body that is not JSON or lacks ``observation``/``done`` raise :class:`OpenEnvError` naming the URL and what
happened, which ends that trajectory (``env: error: OpenEnvError: ...``). Keep ``timeout_s`` below
``environment.timeout_s`` so the adapter's message, not the pool's ``timeout``, names the cause. Over WebSocket the
same, per message (connect, then each send-and-answer), plus an ``error`` message, a closed connection, an answer
of another type and a lost session.
"""

from __future__ import annotations

import http.client
import inspect
import json
import os
import socket
import threading
import time
import urllib.parse
import uuid
from typing import Any

from rlvr.envs.base import EnvStep
from rlvr.envs.tokens import Message


class OpenEnvError(RuntimeError):
    """An OpenEnv server could not be reached or answered something unusable."""


def post_json(url: str, body: dict[str, Any], timeout_s: float) -> Any:
    """POST ``body`` as JSON to ``url``; the decoded JSON answer. The whole call (connect, send, read) ends within
    about ``timeout_s`` seconds.

    Errors: :class:`OpenEnvError` for a refused or failed connection, a timeout, a status other than 2xx (with the
    start of its body) or a body that is not JSON."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OpenEnvError(f"openenv: {url!r} is not an http(s) URL")
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    deadline = time.monotonic() + timeout_s
    conn = conn_cls(parts.hostname, parts.port, timeout=timeout_s)
    where = f"POST {url}"
    try:
        data = json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json",
                                                       "Accept": "application/json"})
        resp = conn.getresponse()
        chunks = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if conn.sock is not None:
                conn.sock.settimeout(left)
            chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
            if not chunk:
                break
            chunks.append(chunk)
        raw = b"".join(chunks)
    except ConnectionRefusedError:
        raise OpenEnvError(f"openenv: {where}: connection refused (is the server running at that address?)") from None
    except (TimeoutError, socket.timeout):
        raise OpenEnvError(f"openenv: {where}: no answer within timeout_s={timeout_s:g}s") from None
    except (OSError, http.client.HTTPException) as e:
        raise OpenEnvError(f"openenv: {where}: {type(e).__name__}: {e}") from None
    finally:
        conn.close()
    if not 200 <= resp.status < 300:
        text = raw[:300].decode("utf-8", "replace")
        raise OpenEnvError(f"openenv: {where}: HTTP {resp.status} {resp.reason}: {text}")
    try:
        return json.loads(raw)
    except ValueError:
        raise OpenEnvError(f"openenv: {where}: the answer is not JSON: {raw[:200]!r}") from None


class OpenEnv:
    """The rlvr side of an OpenEnv HTTP server (see the module docstring).

    ``url``: the server's base URL (``http://host:port``); ``timeout_s``: each request's total deadline (8 s: below
    the pool's default ``environment.timeout_s`` of 10 s);
    ``action_field``: the action key the reply text goes in; ``action_args``: more action keys, fixed;
    ``observation_field``: the observation key shown to the model (None: the whole observation as JSON);
    ``opening``: ``observation`` (open with the reset observation as a user message) or ``row`` (the row's own
    prompt); ``reset_args``: more keys for the reset body (``seed``, ...); ``reward_range``: ``[low, high]`` of the
    server's rewards, mapped linearly onto [0, 1] (clipped).

    Errors: ``ValueError`` for bad arguments; :class:`OpenEnvError` from :func:`post_json` and for an answer that
    lacks ``observation`` or ``done`` or an observation without ``observation_field``."""

    schemes: tuple[str, ...] = ("http://", "https://")

    def __init__(self, url: str, timeout_s: float = 8.0, action_field: str = "message",
                 action_args: dict[str, Any] | None = None, observation_field: str | None = None,
                 opening: str = "observation", reset_args: dict[str, Any] | None = None,
                 reward_range: list[float] | None = None) -> None:
        if not isinstance(url, str) or not url.startswith(self.schemes):
            raise ValueError(f"openenv: url={url!r}; give the server's base URL, e.g. http://localhost:8000")
        if not timeout_s > 0:
            raise ValueError(f"openenv: timeout_s={timeout_s!r}; give a positive number of seconds")
        if opening not in ("observation", "row"):
            raise ValueError(f"openenv: opening={opening!r}; use 'observation' or 'row'")
        if reward_range is not None and (len(reward_range) != 2 or not reward_range[0] < reward_range[1]):
            raise ValueError(f"openenv: reward_range={reward_range!r}; give [low, high] with low < high")
        self.url, self.timeout_s = url.rstrip("/"), float(timeout_s)
        self.action_field, self.action_args = action_field, dict(action_args or {})
        self.observation_field, self.opening = observation_field, opening
        self.reset_args, self.reward_range = dict(reset_args or {}), reward_range
        self.episode_id: str | None = None
        self.steps = 0

    def _call(self, kind: str, data: dict[str, Any]) -> tuple[str, float | None, bool]:
        """``kind`` (``reset``: ``data`` is the reset keys; ``step``: the action) over HTTP; (text, reward, done)."""
        body = data if kind == "reset" else {"action": data, "episode_id": self.episode_id}
        return self._result(post_json(f"{self.url}/{kind}", body, self.timeout_s), f"POST {self.url}/{kind}", kind)

    def _result(self, answer: Any, where: str, kind: str) -> tuple[str, float | None, bool]:
        """An answer ``{"observation": {...}, "reward": number|null, "done": bool}`` (openenv-core's
        ``serialize_observation``, ``serialization.py`` line 136) as (the text shown to the model, the reward
        rescaled by ``reward_range``, done). Errors: :class:`OpenEnvError` for another shape, naming ``where``."""
        if not isinstance(answer, dict) or not isinstance(answer.get("observation"), dict) \
                or not isinstance(answer.get("done", False), bool):
            raise OpenEnvError(f"openenv: {where} answered {str(answer)[:200]!r}; expected "
                               '{"observation": {...}, "reward": number|null, "done": bool}')
        obs, reward = answer["observation"], answer.get("reward")
        if self.observation_field is None:
            text = json.dumps(obs, sort_keys=True)
        elif self.observation_field not in obs:
            raise OpenEnvError(f"openenv: the observation from {kind} has no {self.observation_field!r} (its "
                               f"keys: {', '.join(sorted(obs)) or 'none'}); set environment.args.observation_field")
        else:
            v = obs[self.observation_field]
            text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
        if reward is not None and self.reward_range is not None and isinstance(reward, (int, float)):
            lo, hi = self.reward_range
            reward = min(1.0, max(0.0, (float(reward) - lo) / (hi - lo)))
        return text, reward, bool(answer.get("done", False))

    def _open(self) -> None:
        """Start a new episode: a fresh ``episode_id``."""
        self.episode_id = uuid.uuid4().hex

    def reset(self, row: dict[str, Any]) -> list[Message] | None:
        self.steps = 0
        self._open()
        text, _, _ = self._call("reset", {**self.reset_args, "episode_id": self.episode_id})
        if self.opening == "row":
            return None
        return [{"role": "user", "content": text}]

    def step(self, history: list[Message], reply: Message) -> EnvStep:
        self.steps += 1
        action = {**self.action_args, self.action_field: reply["content"]}
        text, reward, done = self._call("step", action)
        info = {"observation": text[:500], "step": self.steps}
        if done:
            return EnvStep([], reward=reward, done=True, info=info)
        return EnvStep([{"role": "user", "content": text}], reward=reward, done=False, info=info)


MAX_MESSAGE_BYTES = 100 * 2**20
"""The largest WebSocket message accepted (openenv-core's client default, ``max_message_size_mb=100``)."""

RECV_THREAD_STACK = 512 * 2**10
"""Stack bytes of each connection's reader thread (websockets' sync client reads in a thread of its own; the
default 8 MiB of address space each would count against ``environment.memory_mb``)."""

MALLOC_ARENAS = 2
"""glibc malloc arenas allowed in a process that holds sessions: each reader thread would otherwise get an arena of
its own, up to 8 per core, each reserving 64 MiB of address space (``environment.memory_mb`` counts it: at 2048
MiB on 2 cores a worker held 16 sessions with default thread stacks, 241 with small stacks, 1280 with both)."""

_SESSIONS: dict[str, Any] = {}
"""This process's live connections (``websockets.sync.client.ClientConnection``), by episode id: what
:class:`OpenEnvSession` keeps between the calls of a trajectory. Empty in a fresh (replacement) worker."""


def ws_url(url: str) -> str:
    """The ``/ws`` endpoint of a base URL: ``http`` -> ``ws``, ``https`` -> ``wss`` (openenv-core's
    ``convert_to_ws_url``, ``utils.py`` line 42, then ``/ws`` as ``env_client.py`` line 132 adds it)."""
    for old, new in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(old):
            url = new + url[len(old):]
    return url.rstrip("/") + "/ws"


_arenas_capped = False


def _cap_malloc_arenas() -> None:
    """``mallopt(M_ARENA_MAX, MALLOC_ARENAS)`` once in this process (glibc only; elsewhere nothing)."""
    global _arenas_capped
    if _arenas_capped:
        return
    _arenas_capped = True
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-8, MALLOC_ARENAS)  # M_ARENA_MAX (malloc.h)
    except (OSError, AttributeError):  # not glibc: its own malloc, its own rules
        pass


def _drop(episode_id: str | None) -> None:
    """Forget the episode's connection and close its socket at once (no close handshake: after a failure the
    connection may hold a late answer, and a handshake would be one more wait)."""
    ws = _SESSIONS.pop(episode_id, None) if episode_id else None
    if ws is not None:
        ws.close_socket()


def _error_text(answer: Any) -> str | None:
    """``message (code: CODE)`` of an ``{"type": "error", "data": {"message", "code"}}`` answer
    (openenv-core's ``WSErrorResponse``, ``types.py`` line 308); None for anything else."""
    if not isinstance(answer, dict) or answer.get("type") != "error":
        return None
    data = answer.get("data") if isinstance(answer.get("data"), dict) else {}
    return f"{str(data.get('message', '?'))[:300]} (code: {data.get('code', 'UNKNOWN')})"


def _last_message(ws: Any) -> Any:
    """A message the server sent before it closed the connection, decoded (None if there is none)."""
    try:
        return json.loads(ws.recv(timeout=0))
    except Exception:  # noqa: BLE001 - nothing more was said
        return None


class OpenEnvSession(OpenEnv):
    """An OpenEnv server's WebSocket session (``/ws``) as an rlvr environment: one connection per trajectory, kept
    in the worker process that ran its reset (see the module docstring). Arguments as :class:`OpenEnv`; ``url`` may
    also be ``ws://``/``wss://`` (``/ws`` is appended); ``timeout_s`` bounds the connect, each message
    (send and answer) and :meth:`close`. ``sticky = True``: :class:`rlvr.envs.pool.EnvPool` runs every call
    of a trajectory in the worker that ran its reset.

    The server must allow as many concurrent sessions as rlvr runs trajectories at once (openenv-core's
    ``max_concurrent_envs`` defaults to 1; more needs an environment with ``SUPPORTS_CONCURRENT_SESSIONS``),
    else the connect is answered ``CAPACITY_REACHED``.

    Errors: ``ValueError`` for bad arguments; ``ImportError`` without the ``websockets`` package;
    :class:`OpenEnvError` naming the URL and what happened: a refused connection, a refused upgrade (HTTP status),
    no answer within ``timeout_s``, an ``error`` message (its message and code), a closed connection, an answer
    that is not JSON or not an observation, and a step in a process holding no connection for the episode (its
    worker was replaced: "no live session")."""

    sticky = True
    schemes = ("http://", "https://", "ws://", "wss://")

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.ws_url = ws_url(self.url)

    def _fail(self, what: str) -> OpenEnvError:
        _drop(self.episode_id)
        return OpenEnvError(f"openenv: {self.ws_url}: {what}")

    def _connect(self) -> Any:
        try:
            from websockets.exceptions import InvalidHandshake, InvalidStatus
            from websockets.sync.client import connect
        except ImportError as e:
            raise ImportError("openenv_ws needs the websockets package: pip install 'websockets>=15'") from e
        # legacy=True: a plain connection, not the context manager websockets 17 plans (where it takes the flag)
        legacy = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}
        _cap_malloc_arenas()
        stack = threading.stack_size(RECV_THREAD_STACK)  # the connection's reader thread: a small stack
        try:
            return connect(self.ws_url, open_timeout=self.timeout_s, close_timeout=self.timeout_s,
                           ping_interval=None, proxy=None, max_size=MAX_MESSAGE_BYTES, **legacy)
        except ConnectionRefusedError:
            raise self._fail("connection refused (is the server running at that address?)") from None
        except (TimeoutError, socket.timeout):
            raise self._fail(f"no connection within timeout_s={self.timeout_s:g}s") from None
        except InvalidStatus as e:
            raise self._fail(f"the server refused the WebSocket upgrade: HTTP {e.response.status_code} (does it "
                             "serve /ws? openenv-core 0.3.0 does; an HTTP-only server: use 'openenv')") from None
        except (OSError, InvalidHandshake) as e:
            raise self._fail(f"could not connect: {type(e).__name__}: {e}") from None
        finally:
            threading.stack_size(stack)

    def _live(self) -> Any:
        ws = _SESSIONS.get(self.episode_id or "")
        if ws is None:
            raise OpenEnvError(
                f"openenv: {self.ws_url}: no live session for episode {self.episode_id} in this worker process "
                f"(pid {os.getpid()}): its connection lived in the worker that ran its reset, which was replaced "
                "(it died, or was killed at environment.timeout_s), or an earlier failure closed it; the trajectory "
                "ends here")
        return ws

    def _exchange(self, message: dict[str, Any], answer_type: str) -> Any:
        """Send ``message`` on this episode's connection; the ``data`` of the answer of type ``answer_type``,
        within ``timeout_s``. On any failure the session ends: after an ``error`` answer politely (:meth:`close`),
        else the connection is dropped at once (what it would answer next is unknown)."""
        from websockets.exceptions import ConnectionClosed

        ws = self._live()
        kind = message["type"]
        try:
            ws.send(json.dumps(message))
            raw = ws.recv(timeout=self.timeout_s)
        except TimeoutError:
            raise self._fail(f"{kind}: no answer within timeout_s={self.timeout_s:g}s") from None
        except ConnectionClosed as e:
            # a server that refuses a session (CAPACITY_REACHED) sends its error, then closes: say the error
            last = _error_text(_last_message(ws))
            raise self._fail(f"{kind}: the server closed the connection ({e})" if last is None else
                             f"{kind}: the server answered an error and closed the connection: {last}") from None
        except OSError as e:
            raise self._fail(f"{kind}: {type(e).__name__}: {e}") from None
        try:
            answer = json.loads(raw)
        except ValueError:
            raise self._fail(f"{kind}: the answer is not JSON: {str(raw)[:200]!r}") from None
        if _error_text(answer) is not None:  # still in step with the server: end the session politely
            try:
                self.close()
            except OpenEnvError:
                pass
            raise OpenEnvError(f"openenv: {self.ws_url}: {kind}: the server answered an error: {_error_text(answer)}")
        if not isinstance(answer, dict) or answer.get("type") != answer_type or not isinstance(answer.get("data"),
                                                                                               dict):
            raise self._fail(f"{kind}: answered {str(answer)[:200]!r}; expected "
                             f'{{"type": "{answer_type}", "data": {{...}}}}')
        return answer["data"]

    def _call(self, kind: str, data: dict[str, Any]) -> tuple[str, float | None, bool]:
        """``kind`` (``reset``: ``data`` is the reset keys; ``step``: the action) on the episode's connection."""
        answer = self._exchange({"type": kind, "data": data}, "observation")
        try:
            return self._result(answer, f"{self.ws_url} {kind}", kind)
        except OpenEnvError:
            _drop(self.episode_id)
            raise

    def _open(self) -> None:
        """A fresh ``episode_id`` and its connection, kept in this process (:data:`_SESSIONS`)."""
        _drop(self.episode_id)  # a second reset of one object starts a new session
        super()._open()
        _SESSIONS[self.episode_id] = self._connect()

    def server_state(self) -> dict[str, Any]:
        """The session's state as the server reports it (``{"type": "state"}``, ``http_server.py`` line 1419)."""
        return self._exchange({"type": "state"}, "state")

    def close(self) -> None:
        """End the session: send ``{"type": "close"}``, then wait up to ``timeout_s`` for the server to end the
        connection (openenv-core's server ends the session's environment and closes at once: ``http_server.py``
        line 1429 ``break``, then ``websocket.close()``; closing first from this side makes its close raise, which
        it logs as an ASGI exception), else close it from here: the wait and the close handshake within one
        ``timeout_s`` (a close past the pool's ``environment.timeout_s`` would get its worker killed, and with it
        every session that worker holds).
        Nothing to do where this process holds no connection for the episode (a failure already dropped it, or
        the worker was replaced: the socket died with its process). Errors: :class:`OpenEnvError` when the close
        message cannot be sent."""
        from websockets.exceptions import ConnectionClosed

        ws = _SESSIONS.pop(self.episode_id or "", None)
        if ws is None:
            return
        try:
            ws.send(json.dumps({"type": "close"}))
        except Exception as e:  # noqa: BLE001 - a dead connection: nothing left to close but the socket
            ws.close_socket()
            raise OpenEnvError(f"openenv: {self.ws_url}: close: {type(e).__name__}: {e}") from None
        deadline = time.monotonic() + self.timeout_s  # the wait and the handshake together: one timeout_s
        try:
            ws.recv(timeout=self.timeout_s)  # a message here is a late one: the session ends all the same
        except (ConnectionClosed, TimeoutError, OSError):
            pass
        ws.close_timeout = max(0.0, deadline - time.monotonic())
        ws.close()
