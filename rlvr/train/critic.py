"""The critic worker: a value model for PPO with GAE, trained in its own role (process / Ray actor).

The critic is a transformers backbone (``AutoModel``: the decoder without its LM head) with a scalar value head
``Linear(H, 1)``. By default it starts from the policy's own weights with a zero-initialised head (initial values
0), as OpenRLHF and verl do when no reward model is given; ``critic.path`` names other weights. It trains with its
own AdamW (plain torch, one rank: the critic of a CPU smoke run is small; see the note in the closing of issue 4).

Values are read in the shifted frame of :class:`rlvr.train.batch.TrainBatch`: ``values[b, t]`` is V of the state
``input_ids[b, : t + 1]``, the state in which the token ``input_ids[b, t + 1]`` is chosen.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from rlvr.algos.gae import value_loss
from rlvr.config import Recipe
from rlvr.hardware import keep_freed_memory, set_threads
from rlvr.metrics import names as mn
from rlvr.seeding import critic_order_seed, critic_seed
from rlvr.sync.weights import DTYPES
from rlvr.train.batch import TrainBatch
from rlvr.train.packing import forward_inputs, resolve_packing, split_micro_batches
from rlvr.train.policy import apply_optimizer_settings

log = logging.getLogger(__name__)


class ValueModel(torch.nn.Module):
    """Backbone + scalar head. ``forward(input_ids [b, S], attention_mask [b, S]) -> values [b, S-1]`` (reward
    units, on the head's device; the inputs may be on the host), the value at every position but the last (shifted frame; 0 past a sequence's end). ``packed``: the
    rows packed for the backbone (:mod:`rlvr.train.packing`), the values placed back in the padded frame."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)
        self.packed = False

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # the layout is built where the batch lives (the host); only the model's inputs go to its device
        inputs = forward_inputs(input_ids, attention_mask, self.packed)
        dev = self.value_head.weight.device
        kw = {k: v.to(dev) for k, v in inputs.kwargs.items()}
        hidden = self.backbone(**kw, use_cache=False).last_hidden_state.flatten(0, 1)
        values = self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)  # [R * C]
        index = inputs.index.to(dev)
        return values[index.clamp(min=0)] * (index >= 0)  # [b, S-1]


class CriticWorker:
    """The value model's role. Methods are called by the controller (in-process or through a Ray actor handle)."""

    def __init__(self, recipe: Recipe, model_dir: str):
        from transformers import AutoConfig, AutoModel

        cr = recipe.critic
        set_threads(cr.threads)
        torch.manual_seed(critic_seed(recipe.run.seed))
        self.recipe = recipe
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        if recipe.trainer.malloc == "keep" and self.device.type == "cpu":
            keep_freed_memory()  # trainer.malloc: the critic's large blocks alike
        self.dtype = DTYPES[recipe.model.dtype]
        path = model_dir
        if cr.path is not None:
            from rlvr.models import resolve_model

            path = resolve_model(cr.path)
        cfg = AutoConfig.from_pretrained(path)
        backbone = AutoModel.from_pretrained(path, dtype=torch.float32)
        backbone.config.use_cache = False
        self.model = ValueModel(backbone, cfg.hidden_size).to(self.device)
        self.model.packed = resolve_packing(recipe.trainer.packing, self.model.backbone, cfg.vocab_size, who="critic",
                                            autocast=self._autocast)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cr.lr, betas=recipe.trainer.betas)
        self.updates = 0

    def _autocast(self):
        if self.dtype != torch.float32:
            return torch.autocast(self.device.type, dtype=self.dtype)
        return nullcontext()

    def _values(self, mb: TrainBatch) -> torch.Tensor:
        with self._autocast():
            v = self.model(mb.input_ids, mb.attention_mask)  # host tensors: the model moves its inputs
        return v.float() * mb.loss_mask.to(self.device)

    def _split(self, rows: list[int], lengths: list[int]) -> list[list[int]]:
        """Micro-batches of ``rows`` (indices into ``lengths``, the batch's tokens per sequence [B]): the policy's
        token budget (``trainer.max_tokens_per_micro_batch``: longest first, :func:`rlvr.train.packing.micro_batches`),
        else ``critic.micro_batch_size`` rows at a time in the given order."""
        budget = self.recipe.trainer.max_tokens_per_micro_batch
        order = sorted(rows, key=lambda i: -lengths[i]) if budget else rows  # stable: ties keep their order
        return split_micro_batches(order, lengths, budget, self.model.packed, self.recipe.critic.micro_batch_size)

    @torch.no_grad()
    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        """Values [B, S-1] (reward units) of every response position, 0 elsewhere; no grad."""
        self.model.eval()
        out = torch.zeros_like(batch.loss_mask)
        for idx in self._split(list(range(len(batch))), batch.attention_mask.sum(1).tolist()):
            v = self._values(batch.select(idx))
            out[idx, : v.shape[1]] = v.cpu()
        self.model.train()
        return out

    def train_step(self, batch: TrainBatch, old_values: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
        """Regress the values on ``returns`` with PPO's clipped value loss (:func:`rlvr.algos.gae.value_loss`,
        clip ``critic.value_clip``): ``algorithm.ppo_epochs`` x (B / mini-batch) AdamW steps, the same
        mini-batch sizes as the policy. Loss normaliser: the response tokens of each mini-batch (token mean).
        old_values, returns: [B, S-1]. Returns ``critic/*`` metrics (means over optimizer steps).
        """
        r, cr = self.recipe, self.recipe.critic
        t0 = time.perf_counter()
        self.model.train()
        b, mb_size = len(batch), r.mini_batch
        g = torch.Generator().manual_seed(critic_order_seed(r.run.seed, self.updates))
        stats: dict[str, list[float]] = {}
        lengths = batch.attention_mask.sum(1).tolist()  # [B] tokens of each sequence
        for _epoch in range(r.algorithm.ppo_epochs):
            order = torch.randperm(b, generator=g) if b > mb_size else torch.arange(b)
            for m0 in range(0, b, mb_size):
                mini = order[m0 : m0 + mb_size]
                num_tokens = float(batch.loss_mask[mini].sum().clamp(min=1.0))
                loss_sum = clip_sum = err_sum = 0.0
                for idx in self._split(mini.tolist(), lengths):
                    mb = batch.select(idx)
                    s1 = mb.loss_mask.shape[1]
                    mask = mb.loss_mask.to(self.device)
                    v = self._values(mb)
                    old = old_values[idx, :s1].to(self.device)
                    ret = returns[idx, :s1].to(self.device)
                    tok, vs = value_loss(v, old, ret, mask, r.critic.value_clip)
                    loss = (tok * mask).sum() / num_tokens
                    loss.backward()
                    loss_sum += float(loss.detach())
                    clip_sum += float((vs["value_clip_frac"] * mask).sum())
                    err_sum += float((((v.detach() - ret) ** 2) * mask).sum())
                clip = cr.grad_clip if cr.grad_clip > 0 else float("inf")
                gn = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
                if math.isfinite(gn):  # a NaN/inf gradient skips the update
                    self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                for key, val in ((mn.CRITIC_VALUE_LOSS, loss_sum), (mn.CRITIC_VALUE_CLIP_FRAC, clip_sum / num_tokens),
                                 (mn.CRITIC_VALUE_MSE, err_sum / num_tokens), (mn.CRITIC_GRAD_NORM, gn)):
                    stats.setdefault(key, []).append(val)
        self.updates += 1
        out = {k: sum(v) / len(v) for k, v in stats.items()}
        out[mn.TIMING_CRITIC_INNER_S] = time.perf_counter() - t0
        return out

    def save_state(self, out_dir: str) -> str:
        """Write the value model and its optimizer to ``out_dir/critic.pt`` (torch.save; a checkpoint part)."""
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        path = Path(out_dir) / "critic.pt"
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "updates": self.updates}, path)
        return str(path)

    def load_state(self, out_dir: str) -> bool:
        """Restore what :meth:`save_state` wrote. Errors: ``FileNotFoundError`` when ``out_dir/critic.pt`` is missing."""
        state = torch.load(Path(out_dir) / "critic.pt", map_location=self.device, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        # a resumed run may change critic.lr and trainer.betas (critic.grad_clip is read at every step); the weight
        # decay stays AdamW's own, as the optimizer was built
        changes = apply_optimizer_settings(self.optimizer, lr=self.recipe.critic.lr, betas=self.recipe.trainer.betas)
        if changes:
            log.info("critic optimizer state loaded; from the recipe: %s",
                     ", ".join(f"{k} {old} -> {new}" for k, old, new in changes))  # fmt: skip
        self.updates = int(state["updates"])
        return True

    def ping(self) -> bool:
        return True
