"""Environments used by the chaos test through the ``path/to/file.py:Name`` plugin form."""

from __future__ import annotations

import os
import time

from rlvr.envs.builtins import Guess


class HangOnceGuess(Guess):
    """The ``guess`` game, except that once the file ``arm`` exists the first step to see it hangs (an environment
    server that stops answering), leaving ``arm + ".fired"`` behind. Never armed: exactly ``guess``."""

    def __init__(self, arm: str, low: int = 1, high: int = 16) -> None:
        super().__init__(low, high)
        self.arm = arm

    def step(self, history, reply):
        if os.path.exists(self.arm) and not os.path.exists(self.arm + ".fired"):
            open(self.arm + ".fired", "w").close()
            time.sleep(3600)
        return super().step(history, reply)
