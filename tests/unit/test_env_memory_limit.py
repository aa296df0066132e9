"""The recipe's ``environment.memory_mb`` reaches the environment workers: a run's multi-turn rollout
(:class:`rlvr.envs.rollout.TurnRollouts`, built from the recipe's ``environment`` section as a training run builds
it) on the real worker pool, driven by a scripted engine; an environment that allocates more than ``memory_mb`` in
its step ends its trajectory with a memory failure, one under the limit does not (issue 38, item 20)."""

from __future__ import annotations

from rlvr.models import resolve_model
from rlvr.models.tiny import VOCAB
from rlvr.recipe import load_recipe
from rlvr.types import Completion, Prompt, SamplingConfig

ENV = "tests/unit/envs_memory.py:Allocates"


def answer_one(prompts: list[Prompt], sampling: SamplingConfig) -> list[Completion]:
    """A scripted engine: every turn is "1" then eos (tiny vocabulary ids), finish reason stop."""
    toks = [VOCAB["1"], VOCAB["<|im_end|>"]]
    return [Completion(prompt_index=p.index, sample_index=0, prompt_ids=list(p.prompt_ids), token_ids=toks,
                       logprobs=[-0.1, -0.2], text="1", finish_reason="stop", policy_version=0) for p in prompts]


def rollout(memory: str, mbs: list[int]) -> list[Completion]:
    """One trajectory per entry of ``mbs`` (the MiB its environment allocates) through ``TurnRollouts`` built from
    ``recipes/tiny_test.yaml`` with ``environment.memory_mb=<memory>``."""
    from rlvr.envs.rollout import TurnRollouts

    r = load_recipe("recipes/tiny_test.yaml", [f"environment.name={ENV}", f"environment.memory_mb={memory}",
                                               "environment.num_workers=1", "environment.timeout_s=60"])  # fmt: skip
    tr = TurnRollouts(r.environment, r.data, r.rollout.max_new_tokens, resolve_model("tiny-random"))
    try:
        prompts = []
        for i, mb in enumerate(mbs):
            p = Prompt(index=i, text="", prompt_ids=[], gold="1", row={"mb": mb}, question="what is 0 plus 1?")
            prompts.append(Prompt(index=i, text="", prompt_ids=tr.renderer.opening_ids(tr.opening(p)), gold="1",
                                  row={"mb": mb}, question=p.question))  # fmt: skip
        completions, _ = tr.submit(prompts, SamplingConfig(n=1, max_new_tokens=8), answer_one).result(timeout=300)
        return completions
    finally:
        tr.close()


def test_environment_memory_mb_limits_each_environment_step():
    # 1024 MiB of address space allowed: a 1024 MiB block plus the worker's own interpreter is over it (the
    # allocation fails: MemoryError, the trajectory ends as an environment failure); 64 MiB is well under it.
    over, under = rollout("1024", [1024, 64])
    assert over.end_reason.startswith("env: ") and "MemoryError" in over.end_reason, over.end_reason
    assert over.failure is not None and "MemoryError" in over.failure
    assert (under.end_reason, under.turn_rewards, under.failure) == ("done", [1.0], None)
    # without a limit the same 1024 MiB step succeeds (bytes(n) touches no page): the failure above is the limit's
    (free,) = rollout("null", [1024])
    assert (free.end_reason, free.turn_rewards, free.turn_info) == ("done", [1.0], [{"mb": 1024}])
