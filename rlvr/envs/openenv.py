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
which this adapter does not speak), so state across steps lives in the server: an environment that keys its state
by ``episode_id`` (``step(action, episode_id=...)`` receives it: the server passes extra body keys an environment's
``step`` accepts), or a server that shares one environment (one trajectory at a time).

Errors: every request has a total deadline of ``timeout_s``; a refused connection, a timeout, an HTTP error status,
a body that is not JSON or lacks ``observation``/``done`` raise :class:`OpenEnvError` naming the URL and what
happened, which ends that trajectory (``env: error: OpenEnvError: ...``). Keep ``timeout_s`` below
``environment.timeout_s`` so the adapter's message, not the pool's ``timeout``, names the cause.
"""

from __future__ import annotations

import http.client
import json
import socket
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

    def __init__(self, url: str, timeout_s: float = 8.0, action_field: str = "message",
                 action_args: dict[str, Any] | None = None, observation_field: str | None = None,
                 opening: str = "observation", reset_args: dict[str, Any] | None = None,
                 reward_range: list[float] | None = None) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
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

    def _call(self, endpoint: str, body: dict[str, Any]) -> tuple[str, float | None, bool]:
        answer = post_json(f"{self.url}/{endpoint}", body, self.timeout_s)
        if not isinstance(answer, dict) or not isinstance(answer.get("observation"), dict) \
                or not isinstance(answer.get("done", False), bool):
            raise OpenEnvError(f"openenv: POST {self.url}/{endpoint} answered {str(answer)[:200]!r}; expected "
                               '{"observation": {...}, "reward": number|null, "done": bool}')
        obs, reward = answer["observation"], answer.get("reward")
        if self.observation_field is None:
            text = json.dumps(obs, sort_keys=True)
        elif self.observation_field not in obs:
            raise OpenEnvError(f"openenv: the observation from {endpoint} has no {self.observation_field!r} (its "
                               f"keys: {', '.join(sorted(obs)) or 'none'}); set environment.args.observation_field")
        else:
            v = obs[self.observation_field]
            text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
        if reward is not None and self.reward_range is not None and isinstance(reward, (int, float)):
            lo, hi = self.reward_range
            reward = min(1.0, max(0.0, (float(reward) - lo) / (hi - lo)))
        return text, reward, bool(answer.get("done", False))

    def reset(self, row: dict[str, Any]) -> list[Message] | None:
        self.episode_id, self.steps = uuid.uuid4().hex, 0
        text, _, _ = self._call("reset", {**self.reset_args, "episode_id": self.episode_id})
        if self.opening == "row":
            return None
        return [{"role": "user", "content": text}]

    def step(self, history: list[Message], reply: Message) -> EnvStep:
        self.steps += 1
        action = {**self.action_args, self.action_field: reply["content"]}
        text, reward, done = self._call("step", {"action": action, "episode_id": self.episode_id})
        info = {"observation": text[:500], "step": self.steps}
        if done:
            return EnvStep([], reward=reward, done=True, info=info)
        return EnvStep([{"role": "user", "content": text}], reward=reward, done=False, info=info)
