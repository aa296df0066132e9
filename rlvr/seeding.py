"""Every seed rlvr derives from ``run.seed``, in one place, each with why it is a stream of its own.

A resumed run must draw exactly what an uninterrupted one draws, so no stream may depend on how many draws another
made before it: each purpose below gets its own seed, a pure function of (run seed, position in the run). The
formulas are the ones rlvr has always used (changing one changes every run's samples); the multipliers are primes
that keep the streams of neighbouring run seeds and steps apart:

==========================  =====================================  ==========================================
purpose                     seed                                   drawn by
==========================  =====================================  ==========================================
rollout round r of step s   ``(seed * 1_000_003 + s * 101 + r)``   each engine's sampler, before the call
                            ``mod (2**31 - 1)``
DPH-RL buffer rollout       rollout seed of step 0, round 999      (no training step is step 0)
too-stale groups of step s  rollout seed of step s, round 100      regeneration under ``rollout.max_staleness``
turn t of a rollout seed S  ``(S + t * 10_000_019) mod (2**31-1)`` each engine's sampler, per multi-turn round
DPH-RL buffer prompts       ``seed * 31 + 5``                      ``random.Random`` choice of the prompts
DPH-RL batch of step s      ``seed * 1_000_003 + s``               ``random.Random`` draw from the buffer
engine i                    ``seed + i``                           the engine's own default sampler seed
trainer rank k              ``seed + k``                           ``torch.manual_seed`` at start (dropout)
critic                      ``seed + 7``                           ``torch.manual_seed`` at start
policy mini-batch order     ``seed * 7919 + version``              ``torch.randperm`` per update
critic mini-batch order     ``seed * 104729 + updates``            ``torch.randperm`` per update
prompt order of epoch e     ``seed + e``                           :class:`rlvr.data.sampler.PromptSampler`
transformers engine call    ``request seed * 1_000_003``, or       the HF engine's torch generator
                            ``engine seed * 1_000_003 + calls``
==========================  =====================================  ==========================================

``tests/unit/test_seeding.py`` fails when seed arithmetic appears anywhere else in the package.

The generators a process seeds, as a checkpoint saves them (:func:`rng_state`, :func:`set_rng_state`: JSON-safe
data, the controller's in ``controller.json``, each trainer rank's in ``rng_rank{k}.json``). numpy and torch are
imported inside them: this module imports neither.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Mapping
from typing import Any

SEED_MODULUS = 2**31 - 1
"""Seeds handed to engines stay below 2**31 - 1 (vLLM and NumPy take 32-bit seeds)."""
DPH_BUFFER_ROUND = 999
"""The DPH-RL buffer's rollout is "step 0, round 999": never a training step's (steps start at 1)."""
STALE_ROUND = 100
"""Groups regenerated because their samples were older than ``rollout.max_staleness`` (asynchronous rollout) are
step s's round 100: above any DAPO refill round (``dynamic_sampling_max_rounds`` is a few) and below the next
step's round 0 (``(s + 1) * 101``)."""


def rollout_seed(seed: int, step: int, round_: int = 0) -> int:
    """The sampling seed of generation round ``round_`` (0: the step's rollout; 1, 2, ...: DAPO refills) of
    ``step``: every engine seeds its sampler with it before the call, so a resumed run draws the same rollouts."""
    return (seed * 1_000_003 + step * 101 + round_) % SEED_MODULUS


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of turn ``turn`` (0: the first) of a multi-turn rollout seeded ``seed``: the rollout's own
    seed for the first turn (a one-turn rollout samples as a single-turn one), then steps of 10_000_019, far from
    the 101 per training step and the rounds of :func:`rollout_seed`."""
    return (seed + turn * 10_000_019) % SEED_MODULUS


def request_seed(seed: int, prompt_index: int, sample: int) -> int:
    """The sampling seed of one request (sample ``sample`` of prompt ``prompt_index``) of a call seeded ``seed``,
    for an engine with in-flight updates (:mod:`rlvr.rollout.inflight`): its batches overlap in one engine, so a
    request draws from a generator of its own and samples the same tokens whatever else runs beside it."""
    return (seed * 7_919 + prompt_index * 1_009 + sample * 31 + 17) % SEED_MODULUS


def dph_prompt_seed(seed: int) -> int:
    """Which training prompts the DPH-RL buffer samples (one choice per run)."""
    return seed * 31 + 5


def dph_batch_seed(seed: int, step: int) -> int:
    """Which buffer samples join the DPH-RL term at ``step``."""
    return seed * 1_000_003 + step


def engine_seed(seed: int, index: int) -> int:
    """Engine ``index``'s default sampler seed (requests without a seed of their own draw from it)."""
    return seed + index


def trainer_seed(seed: int, rank: int) -> int:
    """Trainer rank ``rank``'s torch seed at start (each rank its own: dropout, if a model has it)."""
    return seed + rank


def critic_seed(seed: int) -> int:
    """The critic's torch seed at start (its value head's init)."""
    return seed + 7


def policy_order_seed(seed: int, version: int) -> int:
    """The mini-batch order of the policy update that makes policy version ``version + 1``."""
    return seed * 7919 + version


def opponent_seed(game_seed: int) -> int:
    """A TextArena game's opponent generator (:mod:`rlvr.envs.textarena`), from the game's own seed (the row's): one
    stream per game, apart from the game's own draws."""
    return game_seed + 1


def critic_order_seed(seed: int, updates: int) -> int:
    """The mini-batch order of the critic's update number ``updates + 1``."""
    return seed * 104729 + updates


def epoch_seed(seed: int, epoch: int) -> int:
    """The prompt order of data epoch ``epoch`` (a permutation per epoch)."""
    return seed + epoch


def hf_generator_seed(request_seed: int | None, engine_seed_: int, calls: int) -> int:
    """The transformers engine's torch generator seed for one ``generate`` call: from the request's seed when it has
    one (the same request draws the same samples whenever it is made), else from the engine's seed and its call
    count (unseeded calls differ from one another)."""
    if request_seed is not None:
        return request_seed * 1_000_003
    return engine_seed_ * 1_000_003 + calls


def numpy_seed(seed: int) -> int:
    """``seed`` folded into NumPy's 32-bit seed range."""
    return seed % 2**32


# -- RNG states --------------------------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """This process's RNG states as JSON-safe data: Python ``random``, numpy's global generator, torch's CPU
    generator (and every CUDA device's, when CUDA is initialised)."""
    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    out: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["torch_cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return out


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore states saved by :func:`rng_state` (``torch_cuda`` only where CUDA is available).

    Errors: ``KeyError`` when ``python``, ``numpy`` or ``torch`` is missing.
    """
    import numpy as np
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_unb64(state["torch"]))
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["torch_cuda"]])


def _b64(t: Any) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> Any:
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()
