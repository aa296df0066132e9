"""The trainer rank of ``rlvr serve``: rlvr's :class:`~rlvr.train.policy.PolicyWorker` with the Tinker API's split
update (``forward_backward`` accumulates gradients, ``optim_step`` applies them with the caller's Adam settings).

A Tinker datum is one sequence: ``tokens`` [N] (the model input) and its ``loss_fn_inputs``, each [N] and aligned
with the input: position i of ``target_tokens`` is the token predicted after input token i (Tinker's "next-token
alignment"; https://tinker-docs.thinkingmachines.ai/tinker/losses). The logprobs below are
``log softmax(logits_i)[target_i]`` at temperature 1 (nats), whatever the targets are: they are gathered, not read
off the shifted input.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from rlvr.train import lora
from rlvr.train.policy import PolicyWorker

log = logging.getLogger(__name__)

Datum = tuple[list[int], dict[str, np.ndarray]]
"""(input tokens [N], loss_fn_inputs: name -> array or tensor whose first dimension is N)."""


class ServeTrainer(PolicyWorker):
    """One trainer rank of a served model. Beside :class:`PolicyWorker`'s setup, sync and checkpoints it keeps the
    gradient between calls: ``forward_backward`` adds the gradient of a summed loss, ``optim_step`` takes one AdamW
    step with the caller's settings and clears it (Tinker's contract: gradients of several ``forward_backward``
    calls add up until the next ``optim_step``)."""

    def setup(self, master_addr: str, master_port: int) -> bool:
        ok = super().setup(master_addr, master_port)
        self.pending_datums = 0  # datums whose gradient is accumulated, not yet applied
        return ok

    # -- forward ---------------------------------------------------------------------------------------------------
    def _datum_logprobs(self, batch: list[Datum], grad: bool, trained: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Logprobs [N_i] (nats, temperature 1, float32) of each datum's ``target_tokens`` given its input tokens,
        one forward over the ``b`` datums of ``batch``: packed end to end (``trainer.packing``, as ``rlvr train``'s
        forward: :func:`rlvr.train.packing.forward_inputs`) or right-padded. Each datum gets one extra input token
        (id 0) after its last, so that the shifted frame of the forward (position t predicts what follows token t)
        covers all N_i of its positions; causal attention keeps it out of every position before it.

        ``trained``: [sum N_i] bool, the positions whose loss term has a gradient
        (:func:`rlvr.algos.tinker_losses.trained_positions`; None: all). The output layer runs with gradient on
        those rows only and without on the rest (prompt positions, weight 0): as ``rlvr train`` runs it on response
        tokens only, for a model with a 49k vocabulary most of the cost of the rows it skips."""
        from rlvr.algos.logprobs import logprobs_and_entropy
        from rlvr.models.heads import lean_output_head
        from rlvr.train.packing import forward_inputs

        lengths = [len(t) for t, _ in batch]
        s = max(lengths) + 1
        ids = torch.zeros((len(batch), s), dtype=torch.long)
        am = torch.zeros((len(batch), s), dtype=torch.long)
        mask = torch.zeros((len(batch), s - 1), dtype=torch.bool)  # [b, S-1]: the datums' N_i positions
        for i, (toks, _) in enumerate(batch):
            ids[i, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            am[i, : len(toks) + 1] = 1
            mask[i, : len(toks)] = True
        inputs = forward_inputs(ids, am, self.packing)
        kw = {k: v.to(self.device) for k, v in inputs.kwargs.items()}
        at = inputs.index[mask].to(self.device)  # [sum N_i]: each position's place in the flattened output
        targets = torch.cat([torch.as_tensor(inp["target_tokens"], dtype=torch.long) for _, inp in batch]).to(self.device)
        if self.ds and self._forward_prologue is not None:
            self._forward_prologue()
        model = lora.inner(self.module)
        head = lean_output_head(model)
        with torch.set_grad_enabled(grad), self._autocast():
            if head is None:  # the model's own full forward
                logits = model(**kw, use_cache=False).logits.flatten(0, 1)[at]  # [sum N_i, V]
                lp, _ = logprobs_and_entropy(logits, targets, 1.0)  # [sum N_i]
            else:
                hidden = model.model(**kw, use_cache=False).last_hidden_state.flatten(0, 1)[at]  # [sum N_i, H]
                if not grad or trained is None or bool(trained.all()):
                    lp, _ = logprobs_and_entropy(head(hidden), targets, 1.0)  # [sum N_i]
                else:
                    on = trained.to(self.device)
                    lp_on, _ = logprobs_and_entropy(head(hidden[on]), targets[on], 1.0)  # [T], with gradient
                    with torch.no_grad():
                        lp_off, _ = logprobs_and_entropy(head(hidden[~on]), targets[~on], 1.0)  # [sum N_i - T]
                    lp = torch.zeros(len(targets), dtype=lp_on.dtype, device=self.device)
                    lp = lp.masked_scatter(~on, lp_off.to(lp.dtype)).masked_scatter(on, lp_on)
        return list(torch.split(lp, lengths))

    def _micro_batches(self, data: list[Datum]) -> list[list[int]]:
        """Datum indices in micro-batches, longest first (less padding): ``trainer.micro_batch_size`` datums each,
        or by the token budget ``trainer.max_tokens_per_micro_batch`` (:func:`rlvr.train.packing.split_micro_batches`,
        what ``rlvr train`` does)."""
        lengths = [len(t) + 1 for t, _ in data]
        order = sorted(range(len(data)), key=lambda i: -lengths[i])
        return self._split(order, lengths, max(1, self.recipe.trainer.micro_batch_size))

    def forward_backward(self, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, float] | None,
                         forward_only: bool = False) -> dict[str, Any]:
        """The Tinker ``forward_backward`` (``forward`` with ``forward_only``) on ``data``: for each datum the
        loss ``loss_fn`` (:func:`rlvr.algos.tinker_losses.tinker_loss`, a sum over its tokens); the gradient of the
        sum over all datums is added to the accumulated one (not with ``forward_only``). Returns
        ``{"outputs": [{"logprobs": [N_i] float32, ...}] in the order of data, "metrics": {name: value}}``: the
        metrics are the sums over datums of each datum's (Tinker's ``name:sum`` convention).
        Errors: ``ValueError`` for a bad datum or loss (nothing is accumulated then)."""
        from rlvr.algos.tinker_losses import POSITIONWISE, tinker_loss, trained_positions

        # each datum's inputs as tensors, once (copies: Ray hands read-only arrays)
        inputs = [{k: torch.tensor(np.asarray(v)) for k, v in inp.items()} for _, inp in data]
        for i, ((toks, inp), x) in enumerate(zip(data, inputs)):
            check_datum(i, toks, inp, self.vocab_size)
            # the loss's own checks (keys, shapes, values, config) on every datum before any forward: a bad datum
            # fails the call with no gradient of the others accumulated
            try:
                tinker_loss(loss_fn, torch.zeros(len(toks)), x, loss_fn_config)
            except ValueError as e:
                raise ValueError(f"datum {i}: {e}") from None
        was = self.module.training
        self.module.train(not forward_only)
        outputs: list[dict[str, np.ndarray]] = [{} for _ in data]
        metrics: dict[str, float] = {}
        try:
            for idx in self._micro_batches(data):
                tensors = [inputs[i] for i in idx]
                part = [(data[i][0], inputs[i]) for i in idx]  # the inputs as the tensors made above
                trained = torch.cat([trained_positions(loss_fn, t) for t in tensors])
                lps = self._datum_logprobs(part, grad=not forward_only, trained=trained)
                if loss_fn in POSITIONWISE:  # one call for the micro-batch: a sum of per-position terms
                    groups = [(torch.cat(lps), {k: torch.cat([t[k] for t in tensors]).to(self.device)
                                                for k in tensors[0]})]  # fmt: skip
                else:
                    groups = [(lp, {k: v.to(self.device) for k, v in t.items()}) for lp, t in zip(lps, tensors)]
                total = None
                for lp, x in groups:
                    loss, m = tinker_loss(loss_fn, lp, x, loss_fn_config)
                    total = loss if total is None else total + loss
                    for k, v in m.items():
                        metrics[k] = metrics.get(k, 0.0) + float(v)
                for i, lp in zip(idx, lps):
                    outputs[i] = {"logprobs": lp.detach().float().cpu().numpy()}
                if not forward_only and total is not None:
                    self._backward(total)
        finally:
            self.module.train(was)
        if not forward_only:
            self.pending_datums += len(data)
        return {"outputs": outputs, "metrics": metrics}

    def _backward(self, loss: torch.Tensor) -> None:
        if self.ds:
            self.engine.set_gradient_accumulation_boundary(False)
            self.engine.backward(loss, scale_wrt_gas=False)
        elif self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    @property
    def vocab_size(self) -> int:
        return int(lora.inner(self.module).config.vocab_size)

    # -- the update ------------------------------------------------------------------------------------------------
    def optim_step(self, learning_rate: float, beta1: float, beta2: float, eps: float, weight_decay: float = 0.0,
                   grad_clip_norm: float = 0.0) -> dict[str, float]:
        """One AdamW step (decoupled weight decay, Loshchilov & Hutter 2019) on the accumulated gradient with the
        caller's settings (Tinker's ``AdamParams``), then the gradient is cleared. ``grad_clip_norm`` > 0 clips the
        global L2 norm to it (0: no clipping). A non-finite gradient norm skips the update (as ``rlvr train``
        does). Returns ``{"grad_norm": norm before clipping, "applied": 1.0 or 0.0, "datums": how many datums'
        gradients the step applied}``."""
        for g in self.optimizer.param_groups:
            g.update(lr=float(learning_rate), betas=(float(beta1), float(beta2)), eps=float(eps),
                     weight_decay=float(weight_decay))
        if self.ds:  # the update happens in engine.step() at the accumulation boundary
            self._ds_boundary_step(grad_clip_norm)
        gn, applied = self._optimizer_step(grad_clip_norm)  # rlvr train's: clip, skip a non-finite step, clear
        datums, self.pending_datums = self.pending_datums, 0
        self.version += 1
        return {"grad_norm": gn, "applied": float(applied), "datums": float(datums)}

    def _ds_boundary_step(self, grad_clip_norm: float) -> None:
        """DeepSpeed: a zero-loss backward at the accumulation boundary (what reduces the accumulated gradient under
        ZeRO), then ``engine.step()`` applies it with the clipping norm set for this step."""
        self.engine._config.gradient_clipping = float(grad_clip_norm)
        if hasattr(self.optimizer, "clip_grad"):
            self.optimizer.clip_grad = float(grad_clip_norm)
        self.engine.set_gradient_accumulation_boundary(True)
        lp = self._datum_logprobs([([0, 0], {"target_tokens": np.zeros(2, dtype=np.int64)})], grad=True)[0]
        self.engine.backward(lp.sum() * 0.0, scale_wrt_gas=False)
        self.engine.step()

    def load_weights(self, ckpt_dir: str, optimizer: bool) -> int:
        """Tinker's ``load_weights``: the weights of a :meth:`save_state` folder, with the optimizer state when
        ``optimizer`` (exactly what was saved), else with a fresh AdamW state. Returns the policy version."""
        if optimizer:
            version = self.load_state(ckpt_dir)
        else:
            from pathlib import Path

            if self.ds:
                raise ValueError("load_weights without the optimizer state is not supported under DeepSpeed: load "
                                 "with the optimizer (create_training_client_from_state_with_optimizer)")
            state = torch.load(Path(ckpt_dir) / "torch_state.pt", map_location=self.device, weights_only=False)
            if self.lora:
                lora.load_adapter_state(self.module, state["model"])
            else:
                self.module.load_state_dict(state["model"])
            self.optimizer.state.clear()
            version = int(state["version"])
        self.version = version
        self.pending_datums = 0
        return version


def check_datum(i: int, tokens: list[int], inputs: dict[str, np.ndarray], vocab: int) -> None:
    """Raise ``ValueError`` naming datum ``i`` and the fix when its input is not one the trainer can run: empty
    input, ids outside the vocabulary, no ``target_tokens``, or a loss input whose first dimension is not N."""
    n = len(tokens)
    if n == 0:
        raise ValueError(f"datum {i}: model_input is empty (give at least one token)")
    lo, hi = min(tokens), max(tokens)
    if lo < 0 or hi >= vocab:
        raise ValueError(f"datum {i}: model_input has token id {lo if lo < 0 else hi}, outside the vocabulary [0, {vocab})")
    if "target_tokens" not in inputs:
        raise ValueError(f"datum {i}: loss_fn_inputs lacks 'target_tokens' ([N] int64, the token after each input token)")
    for k, v in inputs.items():
        a = np.asarray(v)
        if a.ndim != 1 or a.shape[0] != n:
            raise ValueError(f"datum {i}: loss_fn_inputs[{k!r}] has shape {list(a.shape)}; it must be [N] = [{n}], "
                             "one value per input token (2-D inputs such as top-k targets are not supported)")
    t = np.asarray(inputs["target_tokens"])
    if t.size and (int(t.min()) < 0 or int(t.max()) >= vocab):
        raise ValueError(f"datum {i}: target_tokens holds ids outside the vocabulary [0, {vocab})")
