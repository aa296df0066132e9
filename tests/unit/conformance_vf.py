"""The conformance suite's verifiers 0.4.0 environment (tests/unit/test_env_conformance.py): a taskset of one task
whose ``Env.run`` plays the suite's game in ``mode`` (tests/unit/conformance_envs.py's module docstring), written
against verifiers' own API: the task's prompt is the opening; a reply "7" wins (``won``, weight 1); any other gets
"again"; ``malformed`` weighs ``won`` 5 (a reward outside the adapter's ``reward_range``). ``__all__`` exports the
taskset and its ``Env``, as verifiers finds them."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import verifiers.v1 as vf

__all__ = ["ConfEnv", "ConfTaskset"]

OPENING, LONG_CHARS, HANG_S = "say a number", 200_000, 60.0


class ConfConfig(vf.TasksetConfig):
    mode: str = "ok"
    armed: str = ""
    """``reset_raises`` raises only once this file exists: the rows (made at load, each replaying the opening) are
    made first, then the file, then the reset in a worker fails (a reset that fails at run time)."""


class ConfData(vf.TaskData):
    info: dict


class ConfTask(vf.Task[ConfData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def won(self, trace) -> float:
        replies = [m.content or "" for m in trace.assistant_messages]
        return float(bool(replies) and replies[-1].strip() == "7") * (5.0 if self.data.info["mode"] == "malformed" else 1.0)


class ConfTaskset(vf.Taskset[ConfTask, ConfConfig]):
    def load(self) -> Iterator[ConfTask]:
        yield ConfTask(ConfData(id="conf-0", prompt=OPENING, info={"mode": self.config.mode,
                                                                    "armed": self.config.armed}), self.config.task)


class ConfEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class ConfEnv(vf.Env[ConfEnvConfig]):
    async def run(self, task, agents):
        mode = task.data.info["mode"]
        if mode == "reset_raises" and os.path.exists(task.data.info["armed"]):
            raise RuntimeError("reset broke")
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            n = 0
            while not segment.terminated and (segment.last_reply or "").strip() != "7":
                n += 1
                text = "again"
                if n == 1 and mode == "step_raises":
                    raise RuntimeError("step broke")
                if n == 1 and mode == "step_hangs":
                    time.sleep(HANG_S)
                if n == 1 and mode == "dies":
                    os._exit(3)
                if n == 1 and mode == "long_obs":
                    text = "z" * LONG_CHARS
                segment = await interaction.turn(text)
