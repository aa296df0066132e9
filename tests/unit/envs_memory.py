"""An environment that allocates a chosen amount of memory in its step (test_env_memory_limit): a file of its own, so
that an environment worker loads it without importing the test module's heavy imports."""

from rlvr.envs.base import EnvStep


class Allocates:
    """Allocates ``row["mb"]`` MiB in its step, then ends the trajectory with reward 1 and ``info["mb"]``.

    The block is ``bytes(n)``: zeroed by ``calloc``, so it takes ``n`` bytes of address space (what ``RLIMIT_AS``,
    the environment pool's ``memory_mb``, counts) but touches no page: without a limit even a large block costs no
    real memory."""

    def reset(self, row):
        self.mb = int(row["mb"])
        return None

    def step(self, history, reply):
        block = bytes(self.mb * 2**20)
        return EnvStep([], reward=1.0, done=True, info={"mb": len(block) // 2**20})
