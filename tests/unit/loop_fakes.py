"""Fakes of the four roles for millisecond loop tests: the real controller (:func:`rlvr.runtime.controller.train`,
:class:`rlvr.runtime.roles.Roles`) drives them through the real in-process executor, and each records its calls in
one shared log, so a test can assert the order of a step (generate -> score -> update -> sync) without vLLM,
DeepSpeed or verifier processes.

- engine: answers each prompt's G samples with the gold for even sample indices and "wrong" for odd ones (every
  sample right in its first ``all_right_calls`` calls: groups without signal);
- scorer: 1.0 when the text equals the gold, else 0.0, under the recipe's first verifier key;
- trainer: one fixed weight spec (w = [1.0]), a constant checksum and probe logprobs equal to the engine's (sync
  checks pass: checksum, read-back and probe);
  ``train_step`` counts the batch's sequences;
- critic: values of zero;
- judge: the verdict ``\\boxed{0}`` (step 0 is flawed) for every item, parsed by the item's rule;
- teacher: logprob -0.5 for every token it scores (the engine's are -1.0).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import torch

from rlvr.reward.pool import Scored, verifier_keys
from rlvr.runtime.executors import LocalExecutor, Resources
from rlvr.types import Completion, VerifyResult

SPECS = [("w", (1,), "float32")]


class CallLog:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []  # (role, method)
        self._lock = threading.Lock()

    def add(self, role: str, method: str) -> None:
        with self._lock:
            self.calls.append((role, method))

    def methods(self, *keep: str) -> list[str]:
        return [m for _, m in self.calls if m in keep]


class FakeEngine:
    def __init__(self, model_dir: str, *, log: CallLog, role: str, all_right_calls: int = 0, delay_s: float = 0.0,
                 stale_call: int = -1, sync_s: float = 0.0, seeded: bool = False, **_: Any) -> None:
        self.log, self.role, self.version, self.all_right_calls, self.seeded = log, role, 0, all_right_calls, seeded
        self.delay_s, self.stale_call, self.calls, self.sync_s = delay_s, stale_call, 0, sync_s
        self.versions: list[int] = []  # the policy version each generate call reported

    def generate(self, prompts, sampling):
        self.log.add(self.role, "generate")
        # a sequence of delays: one per call, cycled (uneven stage times)
        time.sleep(self.delay_s if isinstance(self.delay_s, (int, float)) else self.delay_s[self.calls % len(self.delay_s)])
        right = self.all_right_calls > 0  # the first ``all_right_calls`` calls answer every sample right
        self.all_right_calls -= 1
        # call ``stale_call`` (0-based) claims a policy version far in the past (as an engine left behind would),
        # and answers every sample wrong (so that its rewards differ from its regeneration's)
        stale = self.calls == self.stale_call
        version = self.version - 100 if stale else self.version
        self.calls += 1
        self.versions.append(version)

        def ok(p, j):  # seeded: which samples are right depends on the call's seed (each batch differs)
            if stale:
                return False
            if self.seeded and sampling.seed is not None:
                return random.Random(f"{sampling.seed}-{p.index}-{j}").random() < (sampling.seed % 5 + 1) / 6
            return right or j % 2 == 0

        return [Completion(prompt_index=p.index, sample_index=j, prompt_ids=list(p.prompt_ids),
                           token_ids=[5, 6], logprobs=[-1.0, -1.0], text=p.gold if ok(p, j) else "wrong",
                           finish_reason="stop", policy_version=version)
                for p in prompts for j in range(sampling.n)]  # fmt: skip

    def probe_logprobs(self, prompt_ids, n_tokens):
        return [5] * n_tokens, [-1.0] * (len(prompt_ids) - 1 + n_tokens)

    def expected_weights(self):
        return {n: s for n, s, _ in SPECS}

    def init_weight_sync(self, *args):
        return True

    def receive_weights(self, specs, version, bucket_mb=0.0):
        self.log.add(self.role, "receive_weights")
        time.sleep(self.sync_s)
        self.version = version
        return 1.0

    def loaded_blocks(self, names, dtype):  # one worker holding w = [1.0], as the fake trainer sends it
        return [[("w", 0, 1, 0, 1, "float32", torch.ones(1).numpy().tobytes())]]

    def get_policy_version(self):
        return self.version

    def ping(self):
        return True


class FakeScorer:
    def __init__(self, verifiers, *_: Any, log: CallLog, role: str, **__: Any) -> None:
        self.log, self.role, self.key = log, role, verifier_keys(verifiers)[0]
        self.verifiers = list(verifiers)

    def score(self, texts, golds, rows):
        self.log.add(self.role, "score")
        return [Scored(reward=float(t == g), results={self.key: VerifyResult(score=float(t == g))}, latency_s=0.0)
                for t, g in zip(texts, golds)]  # fmt: skip

    def close(self):
        return True

    def ping(self):
        return True


class FakeTrainer:
    def __init__(self, recipe, model_dir, rank, world_size, *_: Any, log: CallLog, role: str, delay_s: float = 0.0,
                 **__: Any) -> None:
        self.log, self.role, self.updates, self.delay_s, self.batches = log, role, [], delay_s, []

    def rendezvous_address(self):
        return "127.0.0.1", 0

    def setup(self, master_addr, master_port):
        self.log.add(self.role, "setup")
        return True

    def weight_specs(self):
        return SPECS

    def init_weight_sync(self, *args):
        return True

    def send_weights(self, bucket_mb=0.0, sample=True):
        self.log.add(self.role, "send_weights")
        return {"checksum": 1.0, "bytes": 4.0, "seconds": 0.0, "samples": {"w": torch.ones(1, 1)}}

    def train_step(self, batch, dph=None):
        self.log.add(self.role, "train_step")
        t0 = time.perf_counter()
        time.sleep(self.delay_s)
        self.updates.append(len(batch))
        self.batches.append(batch)
        return {"train/loss": 0.0, "train/skipped": 0.0, "train/optimizer_steps": 1.0, "train/grad_norm": 1.0,
                "timing/train_inner_s": time.perf_counter() - t0}

    def compute_logprobs(self, batch, reference=False, temperature=None):
        self.log.add(self.role, "compute_logprobs")
        return torch.full_like(batch.loss_mask, -1.0) * batch.loss_mask

    def probe_logprobs(self, prompt_ids, continuations):
        return [[-1.0] * (len(prompt_ids) - 1 + len(c)) for c in continuations]

    def save_state(self, out_dir):
        self.log.add(self.role, "save_state")
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        return out_dir

    def load_state(self, ckpt_dir):
        return 0

    def save_pretrained(self, out_dir):
        return out_dir

    def ping(self):
        return True


class FakeCritic(FakeTrainer):
    def __init__(self, recipe, model_dir, *_: Any, log: CallLog, role: str, **__: Any) -> None:
        self.log, self.role, self.updates = log, role, []

    def compute_values(self, batch):
        self.log.add(self.role, "compute_values")
        return torch.zeros_like(batch.loss_mask)

    def train_step(self, batch, old_values, returns):
        self.log.add(self.role, "critic_step")
        return {"critic/value_loss": 0.0}


class FakeJudge:
    def __init__(self, model_dir: str, *, log: CallLog, role: str, **_: Any) -> None:
        self.log, self.role, self.items = log, role, []

    def judge_with_text(self, items, settings):
        from rlvr.reward.judge import parse_verdict

        self.log.add(self.role, "judge_with_text")
        self.items.extend(items)
        return [parse_verdict("\\boxed{0}", settings.parse) for _ in items], ["\\boxed{0}"] * len(items)

    def ping(self):
        return True


class FakeTeacher:
    """The teacher of on-policy distillation: logprob -0.5 for every token after the first of each sequence."""

    def __init__(self, model_dir: str, *, log: CallLog, role: str, **_: Any) -> None:
        self.log, self.role, self.calls = log, role, []

    def score(self, sequences):
        self.log.add(self.role, "score")
        self.calls.append(sequences)
        return [[-0.5] * (len(s) - 1) for s in sequences]

    def ping(self):
        return True


class FakeExecutor(LocalExecutor):
    """The in-process executor, with each role's class swapped for its fake (by role name). ``generate_s`` /
    ``train_s``: how long the engine's ``generate`` and the trainer's ``train_step`` sleep (holding no CPU;
    ``generate_s`` may be a sequence of seconds, one per generate call, cycled);
    ``sync_s``: how long the engine's ``receive_weights`` sleeps; ``stale_call``: the engine generate call (0-based)
    that reports a policy version 100 versions old (every sample wrong); ``seeded``: which samples are right
    follows the call's sampling seed (a coin seeded by seed, prompt and sample index), so batches differ."""

    def __init__(self, all_right_calls: int = 0, generate_s: float | tuple[float, ...] = 0.0, train_s: float = 0.0,
                 stale_call: int = -1, sync_s: float = 0.0, seeded: bool = False) -> None:
        super().__init__()
        self.log, self.all_right_calls = CallLog(), all_right_calls
        self.generate_s, self.train_s, self.stale_call, self.sync_s = generate_s, train_s, stale_call, sync_s
        self.seeded = seeded
        self.objects: dict[str, Any] = {}

    def spawn(self, name, cls, *args, resources=None, **kwargs):
        fake = (FakeEngine if name.startswith("engine") else FakeScorer if name == "reward"
                else FakeCritic if name == "critic" else FakeJudge if name == "judge"
                else FakeTeacher if name == "teacher" else FakeTrainer)  # fmt: skip
        kw = dict(kwargs, log=self.log, role=name)
        if fake is FakeEngine:
            kw.update(all_right_calls=self.all_right_calls, delay_s=self.generate_s, stale_call=self.stale_call,
                      sync_s=self.sync_s, seeded=self.seeded)
        elif fake is FakeTrainer:
            kw["delay_s"] = self.train_s
        handle = super().spawn(name, fake, *args, resources=resources or Resources(), **kw)
        self.objects[name] = handle._target[1]  # the future of the role object
        return handle
