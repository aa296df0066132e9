"""A small `verifiers` 0.4.0 environment (``verifiers.v1``) for rlvr's adapter (:mod:`rlvr.envs.verifiers_env`),
written against verifiers' own API only (nothing of rlvr): a taskset of seeded one-digit additions, a multi-turn
``Env`` whose ``run`` asks a second question after the model's first answer, ``@vf.reward`` functions with weights,
a ``@vf.stop``, and an optional ``Toolset`` with one tool.

The conversation (``ArithEnv.run``), per task ``a + b`` with a multiplier ``c``:

1. the task's prompt "What is a + b? ..." (a prompted task: the model speaks first, ``interaction.turn()``);
2. when ``followup`` is set (taskset config, default true), the environment answers "Now multiply your answer by
   c. ..." and the model answers again.

Rewards (``ArithTask``; verifiers 0.4.0 awaits them, so they are ``async def``): ``sum_correct`` (weight 0.5): the
last integer of the first reply without tool calls is ``a + b``; ``product_correct`` (weight 0.5): the last integer
of the last such reply (a second one) is ``(a + b) * c`` (``followup: false`` weighs it 0 and ``sum_correct`` 1).
The weighted sum lies in [0, 1].
``gave_up`` (``@vf.stop``): a reply saying "I give up" ends the rollout before the next model call.
``tools: true`` (taskset config) gives each rollout a ``Calculator`` toolset (``calculator_multiply``).

The taskset module exports its ``Taskset`` and ``Env`` subclasses via ``__all__``, which is how verifiers 0.4.0
finds them (``verifiers.v1.utils.loaders``). Load it with ``taskset: examples/verifiers_env/rlvr_vf_arith.py``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import verifiers.v1 as vf

__all__ = ["ArithEnv", "ArithTaskset"]


def last_int(text: str) -> int | None:
    """The last integer in ``text`` (a leading ``-`` kept), None when it has none."""
    found = re.findall(r"-?\d+", text or "")
    return int(found[-1]) if found else None


class ArithTaskConfig(vf.TaskConfig):
    tools: bool = False
    """Give each rollout the Calculator toolset."""


class ArithConfig(vf.TasksetConfig):
    size: int = 1000
    seed: int = 0
    followup: bool = True
    task: ArithTaskConfig = ArithTaskConfig()


class ArithData(vf.TaskData):
    answer: str
    """The sum a + b, as text."""
    info: dict
    """a, b, c and whether the follow-up question is asked."""


class CalculatorConfig(vf.ToolsetConfig):
    pass


class Calculator(vf.Toolset[CalculatorConfig, vf.State]):
    @vf.tool
    def multiply(self, x: int, y: int) -> int:
        """Multiply two integers."""
        return x * y


class ArithTask(vf.Task[ArithData, vf.State, ArithTaskConfig]):
    @vf.reward(weight=0.5)
    async def sum_correct(self, trace) -> float:
        answers = [m for m in trace.assistant_messages if not m.tool_calls]  # tool-call turns are not answers
        return float(bool(answers) and last_int(answers[0].content or "") == int(self.data.answer))

    @vf.reward(weight=0.5)
    async def product_correct(self, trace) -> float:
        want = int(self.data.answer) * self.data.info["c"]
        answers = [m for m in trace.assistant_messages if not m.tool_calls]
        return float(len(answers) > 1 and last_int(answers[-1].content or "") == want)

    @vf.metric
    async def turns(self, trace) -> float:
        return float(trace.num_turns)

    @vf.stop
    def gave_up(self, trace: vf.Trace) -> bool:
        msgs = trace.assistant_messages
        return bool(msgs) and "i give up" in (msgs[-1].content or "").lower()

    @classmethod
    def toolsets(cls, config: ArithTaskConfig) -> list[vf.Toolset]:
        return [Calculator(CalculatorConfig())] if config.tools else []


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> Iterator[ArithTask]:
        rng = random.Random(self.config.seed)
        task_config = self.config.task
        if not self.config.followup:  # one question: its sum is the whole reward
            task_config = task_config.model_copy(
                update={"rewards": {"sum_correct": vf.RewardFunctionConfig(weight=1.0),
                                    "product_correct": vf.RewardFunctionConfig(weight=0.0)}})
        for i in range(self.config.size):
            a, b, c = rng.randint(0, 9), rng.randint(0, 9), rng.randint(2, 3)
            yield ArithTask(ArithData(
                id=f"arith-{self.config.seed}-{i}",
                prompt=f"What is {a} + {b}? End your reply with the number.",
                answer=str(a + b),
                info={"a": a, "b": b, "c": c, "followup": self.config.followup},
            ), task_config)


class ArithEnvConfig(vf.EnvConfig):
    solver: vf.AgentConfig = vf.AgentConfig()


class ArithEnv(vf.Env[ArithEnvConfig]):
    async def run(self, task, agents):
        async with agents.solver.interaction(task) as interaction:
            segment = await interaction.turn()  # a prompted task: the model answers first
            if not segment.terminated and task.data.info["followup"]:
                await interaction.turn(f"Now multiply your answer by {task.data.info['c']}. "
                                       "End your reply with the number.")
