"""A light rollout engine on transformers ``generate``, behind the same interface as :class:`VLLMEngine`.

Slower than vLLM (about half the tokens/s on CPU) but with no vLLM dependency. Sampled logprobs are
``log_softmax(logits / temperature)`` of the chosen token, the same transform the trainer uses (case R1).
"""

from __future__ import annotations

import torch

from rlvr.hardware import bind_cpus, set_threads
from rlvr.rollout.base import checkpoint_shapes
from rlvr.sync.weights import DTYPES, Received, WeightSpec, create_group, receive_stream
from rlvr.types import Completion, Prompt, SamplingConfig



class HFEngine:
    """transformers ``AutoModelForCausalLM`` generation, one prompt's G samples per ``generate`` call."""

    def __init__(self, model_dir: str, *, dtype: str, max_model_len: int, seed: int = 0, threads: int = 1,
                 cpus: tuple[int, ...] = (), **_: object):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        bind_cpus(cpus)
        set_threads(threads)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype]).to(self.device).eval()
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model_dir = model_dir
        self.max_model_len = max_model_len
        self.seed = seed
        self.policy_version = 0
        self.eos_id = self.tok.eos_token_id
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eos_id
        self._calls = 0

    @torch.no_grad()
    def generate(self, prompts: list[Prompt], sampling: SamplingConfig) -> list[Completion]:
        self._calls += 1
        # a seeded request draws the same samples whenever it is made (resume); unseeded ones vary per call
        from rlvr.seeding import hf_generator_seed

        gen = torch.Generator(device="cpu").manual_seed(hf_generator_seed(sampling.seed, self.seed, self._calls))
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        out: list[Completion] = []
        stop = {*(() if sampling.ignore_eos else (self.eos_id,)), *sampling.stop_token_ids}
        strings = {"stop_strings": list(sampling.stop), "tokenizer": self.tok} if sampling.stop else {}
        for p in prompts:
            ids = torch.tensor([p.prompt_ids] * sampling.n, device=self.device)
            res = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else 0,
                max_new_tokens=p.max_new_tokens or sampling.max_new_tokens,  # a trajectory's budget may be less
                eos_token_id=sorted(stop) or None,
                pad_token_id=self.pad_id,
                **strings,
                output_scores=True,
                return_dict_in_generate=True,
            )
            new = res.sequences[:, ids.shape[1] :]  # [G, T]
            # scores are processed logits (temperature/top-p applied): log_softmax gives the sampler's logprobs
            logp = torch.stack([torch.log_softmax(s.float(), -1) for s in res.scores], 1)  # [G, T, V]
            tok_lp = logp.gather(-1, new.unsqueeze(-1)).squeeze(-1)  # [G, T]
            for j in range(sampling.n):
                seq = new[j].tolist()
                n = len(seq)
                for k, t in enumerate(seq):
                    if t in stop:
                        n = k + 1
                        break
                at = _stop_string_end(self.tok, seq[:n], sampling.stop) if sampling.stop else None
                n = at if at is not None else n
                finished = at is not None or n < len(seq) or (len(seq) > 0 and seq[n - 1] in stop)
                out.append(
                    Completion(
                        prompt_index=p.index,
                        sample_index=j,
                        prompt_ids=list(p.prompt_ids),
                        token_ids=seq[:n],
                        logprobs=[float(x) for x in tok_lp[j, :n]],
                        text=self.tok.decode(seq[:n], skip_special_tokens=True),
                        finish_reason="stop" if finished else "length",
                        policy_version=self.policy_version,
                    )
                )
        return out

    @torch.no_grad()
    def sequence_logprobs(self, sequences: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        res = []
        for s in sequences:
            ids = torch.tensor([s], device=self.device)
            logits = self.model(input_ids=ids).logits[0, :-1].float() / temperature
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
            res.append(lp.tolist())
        return res

    @torch.no_grad()
    def probe_logprobs(self, prompt_ids: list[int], n_tokens: int) -> tuple[list[int], list[float]]:
        """Greedy continuation of ``prompt_ids`` (``n_tokens`` ids, eos ignored) and the logprobs [P - 1 + n_tokens]
        (nats, T = 1) of tokens 1.. of prompt + continuation; plain forwards (no generation config, no processors)."""
        seq = list(prompt_ids)
        for _ in range(n_tokens):
            logits = self.model(input_ids=torch.tensor([seq], device=self.device)).logits[0, -1]
            seq.append(int(logits.argmax()))
        return seq[len(prompt_ids) :], self.sequence_logprobs([seq])[0]

    def expected_weights(self) -> dict[str, tuple[int, ...]]:
        return checkpoint_shapes(self.model_dir)

    def init_weight_sync(self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float, name: str) -> bool:
        self._pg = create_group(host=host, port=port, rank=rank, world_size=world_size, backend=backend, timeout_s=timeout_s, name=name)
        self._timeout = timeout_s
        return True

    @torch.no_grad()
    def receive_weights(self, specs: list[tuple[str, tuple[int, ...], str]], version: int, bucket_mb: float = 0.0) -> float:
        wspecs = [WeightSpec(n, tuple(s), d) for n, s, d in specs]
        params = dict(self.model.named_parameters())
        got = Received()
        for n, t in receive_stream(self._pg, wspecs, self.device, self._timeout, bucket_mb, got):
            params[n].copy_(t)  # loaded as its bucket arrives: no second copy of the model
        self.policy_version = version
        return got.checksum

    def loaded_blocks(self, names: list[str], dtype: str) -> list[list[tuple]]:
        """The read-back of the checkpoint tensors ``names`` from the model's parameters (one worker):
        :func:`rlvr.sync.readback.module_blocks`."""
        from rlvr.sync.readback import module_blocks
        from rlvr.sync.weights import DTYPES

        return [module_blocks(self.model, names, DTYPES[dtype])]

    def get_policy_version(self) -> int:
        return self.policy_version

    def ping(self) -> bool:
        return True


def _stop_string_end(tok, ids: list[int], stops: tuple[str, ...]) -> int | None:
    """The length of the shortest prefix of ``ids`` whose text holds one of the stop strings (the sample stops
    with the token that completes it), or None. Holding a stop string only grows with the prefix, so a binary
    search finds it in O(log T) decodes (not one decode per token)."""
    if not any(s in tok.decode(ids) for s in stops):
        return None
    lo, hi = 1, len(ids)  # the answer lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in tok.decode(ids[:mid]) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return lo
