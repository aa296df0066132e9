"""An environment that misbehaves on purpose (test_env_turns): a file of its own, so that a worker loads it without
importing the test module's heavy imports."""

from rlvr.envs.base import EnvStep


class Misbehaves:
    """Hangs on "h", dies on "d", floods memory on "m", answers otherwise."""

    def reset(self, row):
        return None

    def step(self, history, reply):
        import os
        import time

        if reply["content"] == "h":
            time.sleep(60)
        if reply["content"] == "d":
            os._exit(3)
        if reply["content"] == "m":
            _ = bytearray(2**31)
        return EnvStep([{"role": "user", "content": "ok"}], done=True)
