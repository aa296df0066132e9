"""Environments for test_env_pool_calls: a file of its own, so that an environment worker loads it without importing
the test module's heavy imports."""

from rlvr.envs.base import EnvStep

NOT_A_CLASS = "an environment name may point at this string by mistake"


class Echoes:
    """Reports, in its step's ``info``, what its worker handed it: the constructor's ``tag`` (``environment.args``),
    the row's ``gold`` (from ``reset``), the history's contents and the reply's content; counts its steps (state
    that travels as the pickle between calls)."""

    def __init__(self, tag: str = "none") -> None:
        self.tag, self.steps = tag, 0

    def reset(self, row):
        self.gold = row["gold"]
        return [{"role": "user", "content": f"opening for {self.gold}"}]

    def step(self, history, reply):
        self.steps += 1
        return EnvStep([{"role": "user", "content": "more"}], reward=0.5, done=self.steps >= 2,
                       info={"tag": self.tag, "gold": self.gold, "history": [m["content"] for m in history],
                             "reply": reply["content"], "steps": self.steps})


class OnlyReset:
    """Has ``reset`` but no ``step``: not an environment."""

    def reset(self, row):
        return None


class BadOpening:
    """``reset`` returns a string, not a list of messages."""

    def reset(self, row):
        return "hello"

    def step(self, history, reply):
        return EnvStep([], done=True)
