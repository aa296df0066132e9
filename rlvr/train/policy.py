"""The policy worker: one data-parallel rank of the trainer.

Holds the policy (transformers) under DeepSpeed ZeRO (stage 2 by default, 3 selectable) or plain torch AdamW
(``trainer.backend: auto``, the default: torch at one rank, where ZeRO has nothing to partition, DeepSpeed above),
an optional frozen reference model, and the trainer side of weight sync. Every rank receives the whole rollout
batch and takes its own slice of each mini-batch; the loss normalisers are the counts of the *whole* mini-batch
(all ranks, all micro-batches), so the update does not depend on how the batch is split (see
:mod:`rlvr.algos.losses`). The no-grad passes (old and reference logprobs) are split over the ranks and
all-gathered (:meth:`PolicyWorker.compute_logprobs`), and the step's token statistics are sums and counts
combined over the ranks (token means over all ranks' tokens).

Start-up is two-phase, so that the data-parallel group's master lives where rank 0 does: construct every rank
(cheap), ask rank 0 for :meth:`PolicyWorker.rendezvous_address` (its node's IP, a port free there), then call
:meth:`PolicyWorker.setup` on every rank with it (:class:`rlvr.runtime.roles.Roles` does this).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from rlvr.algos.kl import dph_forward_kl, dph_js
from rlvr.algos.objective import dph_term, micro_batch_loss
from rlvr.algos.logprobs import logprobs_and_entropy
from rlvr.config import Recipe
from rlvr.hardware import bind_cpus, free_port, host_ip, keep_freed_memory, set_threads
from rlvr.metrics import names as mn
from rlvr.seeding import policy_order_seed, rng_state, set_rng_state, trainer_seed
from rlvr.sync.weights import DTYPES, WeightSender
from rlvr.train import lora
from rlvr.train.ckpt_write import Writer, host_copy, write_pretrained
from rlvr.train.batch import TrainBatch, pack
from rlvr.train.packing import balanced_shares, forward_inputs, resolve_packing, split_micro_batches
from rlvr.types import Completion

log = logging.getLogger(__name__)


def local_gpu(rank: int, visible: int) -> int | None:
    """The CUDA device index (of the ``visible`` GPUs this process sees) that trainer rank ``rank`` computes on;
    None when it sees none (CPU).

    Under Ray each rank's process sees only the GPUs it holds (``trainer.num_gpus``; Ray sets
    ``CUDA_VISIBLE_DEVICES``): with one, index 0. A process that sees several (a rank holding several GPUs, or
    ranks sharing a node's GPUs outside Ray's isolation, e.g. the local executor on a multi-GPU machine) takes
    ``rank % visible``: ranks packed onto nodes in order, as torchrun numbers them, each on a GPU of its own, never
    an index past the last GPU it sees."""
    if visible < 1:
        return None
    return rank % visible


def pick_device(rank: int) -> tuple[torch.device, int]:
    """(the device trainer rank ``rank`` computes on, its ``LOCAL_RANK``): ``cuda:i`` with ``i =``
    :func:`local_gpu` made this thread's current CUDA device (``torch.cuda.set_device``: DeepSpeed and NCCL
    allocate on the current device, and DeepSpeed sets it from ``LOCAL_RANK``, which :func:`_init_dist` sets to the
    same ``i``); ``cpu`` and 0 without CUDA."""
    i = local_gpu(rank, torch.cuda.device_count()) if torch.cuda.is_available() else None
    if i is None:
        return torch.device("cpu"), 0
    torch.cuda.set_device(i)
    return torch.device("cuda", i), i


def _init_dist(rank: int, world_size: int, master_addr: str, master_port: int, backend: str, local_rank: int) -> None:
    """Join the trainer's data-parallel group (``env://``: the launcher variables set here; ``local_rank``: the
    GPU index of :func:`pick_device`, read by DeepSpeed). A second rank in one process reuses the group."""
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(local_rank),
    )
    if dist.is_initialized():  # a second worker in one process (tests, the local executor) reuses the group
        return
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size)


class _FiniteAdamW(torch.optim.AdamW):
    """AdamW that clips to ``grad_clip`` (<= 0: no clipping) and skips a step whose gradient norm is NaN/inf.

    For DeepSpeed ZeRO-0 in fp32, where DeepSpeed hands the step to the client optimizer without an overflow
    check. It sets the two attributes DeepSpeed's engine reads after ``optimizer.step()``: ``overflow`` (-> the
    engine's ``was_step_applied()``) and ``_global_grad_norm`` (-> ``get_global_grad_norm()``, the L2 norm before
    clipping). The gradients are already all-reduced there, so every rank takes the same decision.
    """

    def __init__(self, params, *, grad_clip: float, **adamw) -> None:
        super().__init__(params, **adamw)
        self.grad_clip = grad_clip
        self.overflow = False
        self._global_grad_norm: float | None = None

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        clip = self.grad_clip if self.grad_clip > 0 else float("inf")
        self._global_grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip)) if params else 0.0
        self.overflow = not math.isfinite(self._global_grad_norm)
        if self.overflow:
            return None
        return super().step(closure)


def apply_optimizer_settings(optimizer: torch.optim.Optimizer, *, lr: float, betas: tuple[float, float],
                             weight_decay: float | None = None) -> list[tuple[str, object, object]]:
    """Set every param group's ``lr``, ``betas`` and (unless None) ``weight_decay`` to the recipe's, after
    ``load_state_dict`` brought back the checkpoint's: torch's ``Optimizer.load_state_dict`` and DeepSpeed's
    checkpoint loading restore the saved param groups whole, so without this a resumed ``trainer.lr=2e-5`` would
    step at the old rate. Adam's moments and step count stay the checkpoint's (verl and OpenRLHF do the same).
    ``optimizer``: a torch optimizer or a DeepSpeed wrapper (its ``param_groups`` are its base optimizer's).
    Returns ``(setting, old, new)`` for each setting that changed (the first group's old value)."""
    new: dict[str, object] = {"lr": float(lr), "betas": tuple(betas)}
    if weight_decay is not None:
        new["weight_decay"] = float(weight_decay)
    groups = optimizer.param_groups
    changes = [(k, tuple(groups[0][k]) if k == "betas" else groups[0][k], v) for k, v in new.items()
               if any((tuple(g[k]) if k == "betas" else g[k]) != v for g in groups)]  # fmt: skip
    for g in groups:
        g.update(new)
    return changes


def _gap_by_age(gap: torch.Tensor, versions: torch.Tensor, mask: torch.Tensor, version: int) -> dict[str, tuple[float, float]]:
    """The rollout gap |old - rollout| ``gap`` [B, T] (nats) summed per token age ``version - versions`` [B, T]
    over the loss mask ``mask`` [B, T]: ``train/rollout_gap_abs_age/<n>`` -> (sum, count), turned into token means
    across micro-batches and ranks (:meth:`PolicyWorker._across_ranks`)."""
    on = mask.bool() & (versions >= 0)
    ages = (version - versions)[on]
    vals = gap[on]
    return {mn.rollout_gap_age(int(a)): (float(vals[ages == a].sum()), float((ages == a).sum()))
            for a in ages.unique().tolist()}  # fmt: skip


def _rank_rows(b: int, world: int, rank: int) -> list[int]:
    """The rows of a [B, ...] batch that ``rank`` of ``world`` computes logprobs for: ``rank, rank + W, ...``,
    padded to ceil(B / W) by repeating its last (the same forwards on every rank)."""
    rows = list(range(rank, b, world)) if world > 1 else list(range(b))
    per = -(-b // world)
    return (rows + rows[-1:] * per)[:per] if rows else [0] * per


def _longest_first(lengths: torch.Tensor) -> torch.Tensor:
    """Positions [n] that order ``lengths`` ([n] tokens per sequence) longest first, ties in their given order."""
    return torch.sort(lengths, descending=True, stable=True).indices


class PolicyWorker:
    """One trainer rank. Methods are called by the controller (in-process or through a Ray actor handle).

    Precision (``model.dtype``), the same in both backends: the parameters, their gradients (accumulated over
    micro-batches) and AdamW's state are fp32, and the forward runs under ``torch.autocast`` in bf16, as in TRL and
    verl's FSDP mixed precision (Micikevicius et al. 2018, "Mixed Precision Training", sec. 3.1: an fp32 master copy
    so that updates smaller than the low-precision grid are kept). A weight sync and ``save_pretrained`` send the
    fp32 weights rounded to bf16. Measured (``benchmarks/bf16_updates.py``, issue 10): DeepSpeed's own bf16 mode
    seeded its fp32 master from the bf16-rounded module, so every master sat on the bf16 grid and an lr-1e-5 step
    moved the bf16 weights by 3-5% of the master's change. Memory per parameter: 16 bytes at one rank (as before);
    under ZeRO-2 with W ranks ``4 + 12 / W`` instead of ``2 + 14 / W`` (fp32 parameters are not partitioned).
    fp16 (GPUs only under DeepSpeed, which refuses fp16 on a CPU) keeps DeepSpeed's fp16 module and loss scaling;
    the torch backend runs fp16 autocast with a ``GradScaler``.
    """

    def __init__(self, recipe: Recipe, model_dir: str, rank: int, world_size: int, master_addr: str | None = None,
                 master_port: int | None = None):
        """Without ``master_addr`` the rank only records its place: ask rank 0 for :meth:`rendezvous_address` (its
        node, a port free there), then call :meth:`setup` on every rank with it. With one, it sets up at once."""
        self.recipe, self.model_dir, self.rank, self.world_size = recipe, model_dir, rank, world_size
        self.ready = False
        self.logprob_rows = 0  # rows this rank ran through compute_logprobs (tests: the sharded forward work)
        if master_addr is not None:
            self.setup(master_addr, int(master_port or 0))

    def rendezvous_address(self) -> tuple[str, int]:
        """(this node's IP as other nodes reach it, a TCP port free on it now): the master address of a group whose
        rank 0 lives in this process (the trainer's data-parallel group, the weight-sync group). Chosen here, not
        on the driver, because on a cluster the driver's node is rarely rank 0's (a KubeRay head has no GPUs)."""
        return host_ip(), free_port()

    def setup(self, master_addr: str, master_port: int) -> bool:
        """Load the policy (and the reference model), join the data-parallel group at ``master_addr:master_port``
        (rank 0's :meth:`rendezvous_address`) and build the optimizer. Every rank calls it, concurrently."""
        from transformers import AutoModelForCausalLM

        recipe, model_dir, rank, world_size = self.recipe, self.model_dir, self.rank, self.world_size
        tr = recipe.trainer
        bind_cpus(tr.cpus)  # trainer.cpus: this rank's cores (rollout.cpus holds the engines')
        set_threads(tr.threads)
        torch.manual_seed(trainer_seed(recipe.run.seed, rank))
        self.master_addr, self.master_port = master_addr, master_port
        self.device, self.local_rank = pick_device(rank)  # cuda:i made current, or cpu
        if tr.malloc == "keep" and self.device.type == "cpu":
            log.info("trainer rank %d: malloc keeps freed memory (trainer.malloc=keep): %s", rank,
                     "applied" if keep_freed_memory() else "not glibc, left as is")
        self.dtype = DTYPES[recipe.model.dtype]
        self.algo = recipe.algorithm
        self.kl_in_loss = self.algo.kl_coef > 0 and self.algo.kl_penalty == "loss"
        self.dph_fn = {"none": None, "forward_kl": dph_forward_kl, "js": dph_js}[self.algo.dph_divergence]
        self.temperature = recipe.rollout.temperature
        self.sender: WeightSender | None = None

        # LoRA under bf16 autocast casts the frozen Linears to bf16 (below): read the checkpoint into memory rather
        # than memory-mapping it, or the fp32 file pages the cast reads stay mapped (never written, never released)
        # beside their bf16 copies: measured on SmolLM2-135M's fp32 checkpoint, RSS 1.05 GB after the cast with
        # the mapping against 0.75 GB without (0.41 GB of it python + torch)
        lora_bf16 = tr.lora.rank > 0 and self.dtype == torch.bfloat16
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **({"disable_mmap": True} if lora_bf16 else {}))
        if tr.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            if tr.lora.rank > 0:  # frozen embeddings: checkpointed blocks need an input that requires grad
                model.enable_input_require_grads()
        model.config.use_cache = False
        # trainer.lora: PEFT adapters, the only trainable parameters; the base weights stay frozen
        self.lora = tr.lora.rank > 0
        # trainer.lora.sync=adapter: a sync sends the adapters alone (the engines serve them as a vLLM LoRA)
        self.adapter_sync = tr.lora.adapter_sync
        if self.lora:
            model = lora.wrap(model, tr.lora, recipe.model.path, seed=recipe.run.seed)  # the same A on every rank
        trainable = [p for p in model.parameters() if p.requires_grad]  # all of them without LoRA
        self.ds = tr.backend == "deepspeed"
        # the autocast dtype: bf16 (and torch-backend fp16) compute over fp32 parameters; None for fp32, and for
        # DeepSpeed fp16, whose module is fp16 itself
        lowp = self.dtype != torch.float32 and not (self.ds and self.dtype == torch.float16)
        self.amp_dtype: torch.dtype | None = self.dtype if lowp else None
        if lora_bf16:  # frozen Linears stored as autocast computes them (bf16 is autocast on both backends)
            lora.frozen_linears_to(model, torch.bfloat16)
        if self.ds:
            self._init_deepspeed(model, trainable)
        else:
            if world_size != 1:
                raise ValueError("trainer.backend=torch runs one rank: set trainer.num_workers=1 or backend=deepspeed")
            self.module = model.to(self.device)
            self.optimizer = torch.optim.AdamW(trainable, lr=tr.lr, betas=tr.betas, weight_decay=tr.weight_decay)
        self.budget = tr.max_tokens_per_micro_batch  # 0: micro-batches of trainer.micro_batch_size sequences
        # trainer.packing: checked on the model as it will compute (device, adapters); every rank runs the same check
        self.packing = resolve_packing(tr.packing, lora.inner(self.module), model.config.vocab_size,
                                       who=f"trainer rank {rank}", autocast=self._autocast)
        # fp16 autocast needs loss scaling, or gradients under 6e-8 flush to zero (DeepSpeed fp16 scales itself)
        self.scaler = torch.amp.GradScaler(self.device.type) if not self.ds and self.dtype == torch.float16 else None
        self.ref = None
        if self.algo.kl_coef > 0 and not self.lora:  # under LoRA: the policy with its adapters off
            # fp32 weights under the policy's autocast: at the start the KL to the policy is exactly 0
            ref_dtype = torch.float32 if self.amp_dtype is not None else self.dtype
            self.ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=ref_dtype).to(self.device).eval()
            self.ref.requires_grad_(False)
        self.version = 0
        self.ready = True
        return True

    def _init_deepspeed(self, model: torch.nn.Module, trainable: list[torch.nn.Parameter]) -> None:
        import deepspeed

        r, tr = self.recipe, self.recipe.trainer
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        _init_dist(self.rank, self.world_size, self.master_addr, self.master_port, backend, self.local_rank)
        micro = min(tr.micro_batch_size, r.mini_batch // self.world_size)
        fp16 = r.model.dtype == "float16"
        # ZeRO 1-3 and the fp16 wrapper skip a non-finite step themselves; ZeRO-0 in fp32 hands the step to the
        # client optimizer unchecked (measured: NaN weights), so there the optimizer clips and skips itself
        unchecked = tr.zero_stage == 0 and not fp16
        config = {
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": r.grad_accum_steps,
            "train_batch_size": micro * r.grad_accum_steps * self.world_size,
            "gradient_clipping": 0.0 if unchecked else tr.grad_clip,
            "zero_optimization": {"stage": tr.zero_stage},
            # bf16 is mixed precision done by torch.autocast (see the class docstring): DeepSpeed's own bf16 mode would
            # cast the module to bf16 and seed its fp32 master from that rounded copy, losing updates under half a
            # bf16 step, and accumulates gradients in bf16
            "bf16": {"enabled": False},
            "fp16": {"enabled": fp16},
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        # a plain torch AdamW: DeepSpeed's own would compile FusedAdam first (~2.5 min on CPU)
        adamw = dict(lr=tr.lr, betas=tr.betas, weight_decay=tr.weight_decay)
        if unchecked:
            opt = _FiniteAdamW(trainable, grad_clip=tr.grad_clip, **adamw)
        else:
            opt = torch.optim.AdamW(trainable, **adamw)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
        self.module = self.engine.module
        # what DeepSpeed's engine.forward does first, and _forward bypasses (it calls the module's parts): ZeRO-3
        # counts micro-steps there; without it every micro-batch's gradient overwrote the one before (measured: 2
        # micro-batches, the update of the second alone; tests/integration/test_bf16_updates.py)
        self._forward_prologue = getattr(self.engine.optimizer, "clear_backward_seen_flag", None)

    # -- forward pieces -----------------------------------------------------------------------------------------
    def _autocast(self):
        """Autocast to ``amp_dtype`` (see ``__init__``), or nothing."""
        if self.amp_dtype is not None:
            return torch.autocast(self.device.type, dtype=self.amp_dtype)
        return nullcontext()

    def _forward(self, model: torch.nn.Module, mb: TrainBatch, need_entropy: bool, entropy_grad: bool = False,
                 temperature: float | None = None):
        """Log-probabilities [b, S-1] of each response token at ``temperature`` (None: the rollout temperature;
        0 elsewhere), and the
        policy's entropy on those positions ([b, S-1]) when ``need_entropy`` (with gradient when ``entropy_grad``:
        the entropy bonus).

        The output layer runs on response positions only (N = response tokens of the micro-batch): for a 135M
        model with a 49k vocabulary that skips ~20% of the FLOPs and the [b, S, V] logits of the prompt tokens.
        Only architectures on :data:`rlvr.models.heads.LEAN_HEADS` do so, with the logit transform their own
        forward applies (Granite's ``logits_scaling``, Cohere's ``logit_scale``, Gemma's soft-capping); any other
        architecture takes the plain full forward.
        """
        from rlvr.models.heads import lean_output_head

        mask = mb.loss_mask.to(self.device).bool()  # [b, S-1]
        targets = mb.input_ids.to(self.device)[:, 1:][mask]  # [N]
        # packed (trainer.packing): the sequences end to end in a few rows; either way `at` places each response
        # token's predicting position in the flattened output (rlvr.train.packing). No KV cache: transformers
        # reads packed position_ids only without one
        inputs = forward_inputs(mb.input_ids, mb.attention_mask, self.packing)
        kw = {k: v.to(self.device) for k, v in inputs.kwargs.items()}
        at = inputs.index.to(self.device)[mask]  # [N]
        if self.ds and model is self.module and self._forward_prologue is not None:
            self._forward_prologue()
        model = lora.inner(model)  # under LoRA: the transformers model, adapters injected in its Linear layers
        head = lean_output_head(model)  # hidden [N, H] -> logits [N, V], or None: full forward
        with self._autocast():
            if head is not None:
                hidden = model.model(**kw, use_cache=False).last_hidden_state.flatten(0, 1)[at]  # [N, H]
                logits = head(hidden)  # [N, V]
            else:
                logits = model(**kw, use_cache=False).logits.flatten(0, 1)[at]  # [N, V]
        temperature = self.temperature if temperature is None else temperature
        # in fp32 chunks of rows, one pass for both; backward recomputes each chunk's softmax, so beside the [N, V]
        # logits no [N, V] fp32 tensor is kept (issue 27: 2.5 GB each at N = 4096, V = 152k); the entropy carries a
        # gradient only when entropy_grad
        lp_flat, ent_flat = logprobs_and_entropy(logits, targets, temperature, need_entropy=need_entropy,
                                                 entropy_grad=entropy_grad)  # [N], [N] or None
        lp = torch.zeros(mask.shape, dtype=lp_flat.dtype, device=self.device).masked_scatter(mask, lp_flat)
        ent = None
        if need_entropy:
            ent = torch.zeros(mask.shape, dtype=ent_flat.dtype, device=self.device).masked_scatter(mask, ent_flat)
        return lp, ent

    @torch.no_grad()
    def compute_logprobs(self, batch: TrainBatch, reference: bool = False, temperature: float | None = None) -> torch.Tensor:
        """Log-probabilities [B, S-1] of every target token under the policy (or the reference), no grad, at
        ``temperature`` (None: the rollout temperature).

        With W data-parallel ranks each rank computes rows ``rank, rank + W, ...`` only (ceil(B / W) rows, the
        last repeated where B is not a multiple of W, so that every rank runs the same number of forwards: ZeRO-3
        gathers parameters collectively in each) and the ranks all-gather the results: every rank returns the
        whole [B, S-1], for 1/W of the forward work. Every rank must call it."""
        model = self.ref if reference and not self.lora else self.module
        was_training = model.training
        model.eval()
        # under LoRA the reference is the policy with its adapters switched off (PEFT's disable_adapter)
        with self.module.disable_adapter() if reference and self.lora else nullcontext():
            mine = self._logprob_rows(model, batch, temperature)
        model.train(was_training)
        world = self.world_size if self.ds else 1
        if world == 1:
            return mine
        import torch.distributed as dist

        parts = [torch.empty_like(mine, device=self.device) for _ in range(world)]
        dist.all_gather(parts, mine.to(self.device))
        out = torch.zeros_like(batch.loss_mask)
        for k, part in enumerate(parts):
            idx = list(range(k, len(batch), world))
            out[idx] = part[: len(idx)].cpu()
        return out

    def _logprob_rows(self, model: torch.nn.Module, batch: TrainBatch, temperature: float | None) -> torch.Tensor:
        """This rank's rows of :meth:`compute_logprobs` ([ceil(B / W), S-1], CPU), by ``model`` in its mode."""
        world = self.world_size if self.ds else 1
        rows = _rank_rows(len(batch), world, self.rank)
        mine = torch.zeros((len(rows), batch.loss_mask.shape[1]), dtype=batch.loss_mask.dtype)
        lengths = batch.attention_mask.sum(1).tolist()

        def plan(rows: list[int]) -> list[list[int]]:  # positions in rows, micro-batch by micro-batch
            # length-sorted micro-batches (less padding; as in train_step): by rows, or by the token budget
            by_len = _longest_first(torch.tensor([lengths[i] for i in rows])).tolist()
            return self._split(by_len, [lengths[i] for i in rows], self.recipe.trainer.micro_batch_size)

        groups = plan(rows)
        # a token budget splits ranks' rows differently: every rank runs as many forwards as the most (ZeRO-3
        # gathers the parameters collectively in each); the extra ones are a one-row forward whose result is unused
        most = max(len(plan(_rank_rows(len(batch), world, k))) for k in range(world)) if world > 1 else len(groups)
        for pos in groups:  # each row's logprobs go back to its own place
            mb = batch.select([rows[j] for j in pos])
            lp, _ = self._forward(model, mb, need_entropy=False, temperature=temperature)
            mine[pos, : lp.shape[1]] = lp.float().cpu()
        for _ in range(most - len(groups)):
            self._forward(model, batch.select(rows[:1]), need_entropy=False, temperature=temperature)
        self.logprob_rows += len(rows)
        return mine

    # -- the update -----------------------------------------------------------------------------------------------
    def train_step(self, batch: TrainBatch, dph: TrainBatch | None = None) -> dict[str, float]:
        """Policy update on one rollout batch: ``ppo_epochs`` x (B / mini-batch) optimizer steps.

        ``dph``: samples of the starting policy (their ``rollout_logprobs`` are pi_ref's) for the DPH-RL term
        (``algorithm.dph_divergence``), added once per optimizer step in its first micro-batch on each rank
        (normaliser: the response tokens of the whole ``dph`` batch, token mean). An optimizer step whose gradient
        norm is NaN/inf is skipped (``train/skipped`` counts them; under DeepSpeed, the steps it did not apply).

        Old logprobs are recomputed with the current weights before the first step when more than one optimizer
        step is taken; with exactly one, the detached logprobs of that step's own forward pass are the same numbers
        and are used instead (one forward pass saved). Returns the step's metrics, the same on every rank: each
        per-token ``train/*`` statistic (entropy, KL, the loss's [B, T] statistics) is a token mean over every
        response token the step's forwards saw (all micro-batches, mini-batches, epochs and ranks: sums over
        counts, :meth:`_across_ranks`), so it does not depend on W or the micro-batch size; a loss's 0-dim
        statistics are averaged over micro-batches (``*_max``: the max); ``train/grad_norm`` is the mean over
        optimizer steps; ``train/loss`` is the whole batch's loss per optimizer step.
        """
        r = self.recipe
        t0 = time.perf_counter()
        self.module.train()
        multi = r.optimizer_steps_per_rollout > 1
        old = self.compute_logprobs(batch) if multi else None
        # KL in the reward (algorithm.kl_penalty=reward) is formed by the controller before the advantages
        ref = self.compute_logprobs(batch, reference=True) if self.kl_in_loss else None
        b, mb_size, world = len(batch), r.mini_batch, self.world_size
        if self.ds and b != r.samples_per_step:
            # DeepSpeed steps at its accumulation boundary, fixed from the recipe's batch at start: another size
            # would leave micro-batches accumulated, or take a step mid-mini-batch
            raise ValueError(f"train_step got {b} sequences; this DeepSpeed trainer was built for the recipe's "
                             f"{r.samples_per_step} (prompts_per_step x samples_per_prompt)")
        stats: dict[str, list[float]] = {}
        sums: dict[str, list[float]] = {}  # token statistic -> [sum over response tokens, token count], this rank
        g = torch.Generator().manual_seed(policy_order_seed(r.run.seed, self.version))
        lengths = batch.attention_mask.sum(1)  # [B] tokens of each sequence
        for _epoch in range(r.algorithm.ppo_epochs):
            order = torch.randperm(b, generator=g) if b > mb_size else torch.arange(b)
            for m0 in range(0, b, mb_size):
                mini = order[m0 : m0 + mb_size]
                num_tokens = float(batch.loss_mask[mini].sum().clamp(min=1.0))
                num_seqs = float(len(mini))
                # length-sorted packing: longest first, dealt to the ranks in turn, so that each micro-batch holds
                # sequences of similar length (less padding; the update is a sum over the mini-batch whatever its
                # split) and the ranks get similar work
                mini = mini[_longest_first(lengths[mini])]
                plans = self._shares(mini.tolist(), lengths.tolist(), world)  # every rank's micro-batches
                mine, most = plans[self.rank], max(len(p) for p in plans)
                for k in range(most):
                    if self.ds and self.budget:  # the last micro-batch ends the step, however many there are
                        self.engine.set_gradient_accumulation_boundary(k == most - 1)
                    if k >= len(mine):  # fewer than another rank's (token budget): a forward and backward of 0
                        self._empty_step(batch.select(mine[0] if mine else [int(mini[0])]))
                        continue
                    idx = torch.tensor(mine[k])
                    s, toks = self._micro_step(batch.select(idx), old, ref, idx, num_tokens, num_seqs,
                                               dph if k == 0 else None)  # fmt: skip
                    for key, v in s.items():
                        stats.setdefault(key, []).append(v)
                    for key, (total, count) in toks.items():
                        acc = sums.setdefault(key, [0.0, 0.0])
                        acc[0] += total
                        acc[1] += count
                grad_norm, applied = self._optimizer_step()
                stats.setdefault(mn.TRAIN_GRAD_NORM, []).append(grad_norm)
                stats.setdefault(mn.TRAIN_SKIPPED, []).append(float(not applied))
        self.version += 1
        # scalar statistics (a loss's 0-dim ones, the grad norm): averaged over micro-batches / steps; "_max" the max
        summed = (mn.TRAIN_LOSS, mn.TRAIN_SKIPPED)
        out = {k: float(max(v) if k.endswith("_max") else sum(v) / len(v)) for k, v in stats.items() if k not in summed}
        out[mn.TRAIN_SKIPPED] = float(sum(stats[mn.TRAIN_SKIPPED]))
        # the loss of the whole batch: the per-micro-batch parts sum to it (global normalisers)
        steps = r.optimizer_steps_per_rollout
        out[mn.TRAIN_LOSS] = float(sum(stats.get(mn.TRAIN_LOSS, [0.0]))) / steps
        out[mn.TRAIN_OPTIMIZER_STEPS] = float(steps)
        out[mn.TRAIN_TOKENS] = float(lengths.sum()) * r.algorithm.ppo_epochs
        out[mn.TIMING_TRAIN_INNER_S] = time.perf_counter() - t0
        return self._across_ranks(out, sums)

    def _across_ranks(self, stats: dict[str, float], sums: dict[str, list[float]]) -> dict[str, float]:
        """Combine every rank's statistics (each rank holds its share of the micro-batches, the same number on
        each). ``sums``: token statistic -> [sum over this rank's response tokens, their count]; the result is
        the sums of all ranks over the counts of all ranks, a token mean over every rank's tokens (0.0 when there
        were none), so W ranks report what one rank reports on the same batch. ``stats`` (scalars):
        ``train/loss`` summed (the whole batch's loss), ``*_max``, timings, skipped and optimizer steps the max,
        the rest the mean over the ranks that have the statistic. Every rank must call it."""
        parts: list[tuple[dict[str, float], dict[str, list[float]]]] = [(stats, sums)]
        if self.world_size > 1 and self.ds:
            import torch.distributed as dist

            parts = [({}, {}) for _ in range(self.world_size)]
            dist.all_gather_object(parts, (stats, sums))
        out: dict[str, float] = {}
        for k in sorted({k for p, _ in parts for k in p}):
            vals = [p[k] for p, _ in parts if k in p]
            if k == mn.TRAIN_LOSS:
                out[k] = float(sum(vals))
            elif k.endswith("_max") or k == mn.TIMING_TRAIN_INNER_S or k in (mn.TRAIN_SKIPPED, mn.TRAIN_OPTIMIZER_STEPS):
                out[k] = float(max(vals))
            else:
                out[k] = float(sum(vals) / len(vals))
        for k in sorted({k for _, q in parts for k in q}):
            total = sum(q[k][0] for _, q in parts if k in q)
            count = sum(q[k][1] for _, q in parts if k in q)
            out[k] = float(total / count) if count > 0 else 0.0
        return out

    def _split(self, order: list[int], lengths: list[int], rows: int) -> list[list[int]]:
        """Micro-batches of sequences ``order`` (indices into ``lengths``, longest first): by the token budget
        (``trainer.max_tokens_per_micro_batch``, :func:`rlvr.train.packing.micro_batches`), or ``rows`` at a time."""
        return split_micro_batches(order, lengths, self.budget, self.packing, rows)

    def _shares(self, mini: list[int], lengths: list[int], world: int) -> list[list[list[int]]]:
        """Every rank's micro-batches of a mini-batch (sequence indices, ``mini`` longest first): with a token
        budget the ranks get equal tokens (:func:`rlvr.train.packing.balanced_shares`), else sequences dealt in
        turn, ``min(trainer.micro_batch_size, mini-batch / W)`` a micro-batch. Every rank computes all of them."""
        if self.budget:
            return [self._split(sh, lengths, 0) for sh in balanced_shares(mini, lengths, world)]
        rows = min(self.recipe.trainer.micro_batch_size, self.recipe.mini_batch // world)
        return [self._split(mini[k::world], lengths, rows) for k in range(world)]

    def _empty_step(self, mb: TrainBatch) -> None:
        """A forward and backward that changes no gradient (its loss times 0): a rank with fewer micro-batches
        than another under a token budget takes part in the collectives of ZeRO's forward and backward."""
        lp, _ = self._forward(self.module, mb, need_entropy=False)
        zero = lp.sum() * 0.0
        if self.ds:
            self.engine.backward(zero, scale_wrt_gas=False)
            self.engine.step()
        else:
            zero.backward()

    def _micro_step(self, mb: TrainBatch, old, ref, idx, num_tokens: float, num_seqs: float,
                    dph: TrainBatch | None) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
        """Forward, loss and backward of one micro-batch. Returns (scalars, token sums): scalars are
        ``train/loss`` (this micro-batch's share of the mini-batch loss), the policy loss's 0-dim statistics and
        ``train/tis_weight_dev_max``; token sums map each per-token statistic (entropy, KL, the loss's [B, T]
        statistics, ``train/tis_weight_dev`` = |w - 1| of the rollout-correction weight w) to (sum over the
        micro-batch's response tokens, their count), and ``train/dph_div`` to (sum, count) over its own samples'
        tokens. :meth:`_across_ranks` turns the sums into token means."""
        al = self.algo
        mask = mb.loss_mask.to(self.device)
        lp, ent = self._forward(self.module, mb, need_entropy=True, entropy_grad=al.entropy_coef > 0)
        s1 = lp.shape[1]
        old_lp = old[idx, :s1].to(self.device) if old is not None else lp.detach()
        adv = mb.advantages.to(self.device)
        if adv.dim() == 2:  # token advantages (gae, KL in the reward): trimmed like the micro-batch
            adv = adv[:, :s1]
        rollout_lp = mb.rollout_logprobs[:, :s1].to(self.device)
        ref_lp = ref[idx, :s1].to(self.device) if ref is not None else None
        dph_loss, dph_stats = self._dph_loss(dph) if dph is not None and self.dph_fn is not None else (None, {})
        out_loss = micro_batch_loss(al, lp, old_lp, adv, mask, rollout_logprobs=rollout_lp, num_tokens=num_tokens,
                                    num_seqs=num_seqs, max_len=mb.max_new_tokens, ref_logprobs=ref_lp, entropy=ent,
                                    dph_loss=dph_loss, world_size=self.world_size)  # fmt: skip
        loss, pstats = out_loss.loss, dict(out_loss.stats)
        kl = pstats.pop("kl", None)
        if self.ds:
            self.engine.backward(out_loss.backward, scale_wrt_gas=False)
            # DeepSpeed counts micro-steps itself: step() after every backward, a real update at the boundary
            self.engine.step()
        elif self.scaler is not None:
            self.scaler.scale(out_loss.backward).backward()
        else:
            out_loss.backward.backward()
        n = float(mask.sum())
        out = {mn.TRAIN_LOSS: float(loss.detach())}
        toks = {mn.TRAIN_ENTROPY: (float((ent.detach() * mask).sum()), n)}
        for k, v in pstats.items():
            if torch.is_tensor(v) and v.dim() > 0:
                v = v.detach().float()
                toks[mn.train_stat(k)] = (float((v * mask).sum()), n)
                if k == "tis_weight":  # how far the rollout correction's weight is from 1 (1: no correction)
                    dev = (v - 1.0).abs() * mask
                    toks[mn.TRAIN_TIS_WEIGHT_DEV] = (float(dev.sum()), n)
                    out[mn.TRAIN_TIS_WEIGHT_DEV_MAX] = float(dev.max()) if dev.numel() else 0.0
            else:
                out[mn.train_stat(k)] = float(v)
        if kl is not None:
            toks[mn.TRAIN_KL] = (float((kl.detach() * mask).sum()), n)
        if mb.versions is not None and torch.is_tensor(pstats.get("rollout_gap_abs")):
            toks.update(_gap_by_age(pstats["rollout_gap_abs"].detach().float().cpu(), mb.versions[:, :s1],
                                    mask.cpu(), self.version))  # fmt: skip
        toks.update(dph_stats)
        return out, toks

    def _dph_loss(self, dph: TrainBatch) -> tuple[torch.Tensor, dict[str, tuple[float, float]]]:
        """DPH-RL term (Li et al. 2025, arXiv 2509.07430, sec. 4) on this rank's share of the starting policy's
        samples: ``dph_coef * sum(div * mask) / (response tokens of the whole dph batch)``; div per token from
        :func:`rlvr.algos.kl.dph_forward_kl` or :func:`~rlvr.algos.kl.dph_js` against the stored pi_ref logprobs.
        Returns (loss, {``train/dph_div``: (divergence summed over this rank's share's tokens, their count)}; {}
        for a rank with no share)."""
        total = float(dph.loss_mask.sum().clamp(min=1.0))
        mine = list(range(self.rank, len(dph), self.world_size))
        # a rank with no share (len(dph) < world size) still runs the forward and backward, on row 0 with weight 0:
        # under ZeRO-3 each forward and backward gathers parameters collectively, so every rank must take part
        weight = 1.0 if mine else 0.0
        part = dph.select(mine or [0])
        m = part.loss_mask.to(self.device)
        lp, _ = self._forward(self.module, part, need_entropy=False)
        ref_lp = part.rollout_logprobs[:, : lp.shape[1]].to(self.device)
        loss, div = dph_term(self.dph_fn, lp, ref_lp, m, self.algo.dph_coef, total, weight)
        return loss, ({mn.TRAIN_DPH_DIV: (float(div.detach().sum()), float(m.sum()))} if mine else {})

    def _optimizer_step(self, grad_clip: float | None = None) -> tuple[float, bool]:
        """Finish one optimizer step: (gradient L2 norm before clipping, whether applied); torch clips to ``grad_clip``.

        DeepSpeed: the last micro-batch's ``engine.step()`` was the accumulation boundary (micro-batches per rank
        == gradient_accumulation_steps), so the update is already done or skipped; "applied" is
        ``engine.was_step_applied()``, never inferred from the norm (``get_global_grad_norm()`` can be stale or
        None after a skipped step, depending on the ZeRO stage and DeepSpeed version). torch: a NaN/inf norm skips;
        ``grad_clip`` None is ``trainer.grad_clip``, <= 0 no clipping (``rlvr serve`` passes the caller's)."""
        if self.ds:
            gn = self.engine.get_global_grad_norm()
            return (float(gn) if gn is not None else float("nan")), bool(self.engine.was_step_applied())
        clip = self.recipe.trainer.grad_clip if grad_clip is None else grad_clip
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        gn = torch.nn.utils.clip_grad_norm_(self.module.parameters(), clip if clip > 0 else float("inf"))
        applied = bool(torch.isfinite(gn))
        if self.scaler is not None:  # skips a non-finite step itself and lowers the loss scale
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif applied:  # a NaN/inf gradient skips the update (as DeepSpeed's overflow check does)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(gn), applied

    # -- weights -------------------------------------------------------------------------------------------------------
    def _named_weights(self):
        """(HF name, tensor in the recipe dtype) for every parameter; gathers ZeRO-3 shards one at a time. Under
        LoRA: the base model's names and weights with each adapter folded in (:func:`rlvr.train.lora.merged_named_weights`)."""
        if self.lora:
            yield from lora.merged_named_weights(self.module, self.dtype)
            return
        zero3 = self.ds and self.recipe.trainer.zero_stage == 3
        for name, p in self.module.named_parameters():
            if zero3:
                import deepspeed

                with deepspeed.zero.GatheredParameters([p]):
                    yield name, p.detach().to(self.dtype).clone()
            else:
                yield name, p.detach().to(self.dtype)

    def _sync_weights(self):
        """(name, tensor in the recipe dtype) of what a sync sends: :meth:`_named_weights`, or under
        ``trainer.lora.sync=adapter`` the adapter tensors alone (:func:`rlvr.train.lora.adapter_named_weights`)."""
        if self.adapter_sync:
            yield from lora.adapter_named_weights(self.module, self.dtype)
        else:
            yield from self._named_weights()

    def adapter_config(self) -> str:
        """The PEFT ``adapter_config.json`` of the adapters (:func:`rlvr.train.lora.adapter_config_json`): what an
        engine writes beside the adapter tensors of an adapter sync. Errors: ``ValueError`` without LoRA."""
        if not self.lora:
            raise ValueError("adapter_config: the policy has no LoRA adapters (trainer.lora.rank=0)")
        return lora.adapter_config_json(self.module)

    def weight_specs(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, shape, dtype) of every tensor a sync sends, in order (no tensor data)."""
        if self.adapter_sync:
            return [(n, shape, str(self.dtype).removeprefix("torch.")) for n, shape in lora.adapter_shapes(self.module)]
        if self.lora:
            return [(n, shape, str(self.dtype).removeprefix("torch.")) for n, shape in lora.base_shapes(self.module)]
        out = []
        for name, p in self.module.named_parameters():
            shape = tuple(p.ds_shape) if hasattr(p, "ds_shape") else tuple(p.shape)
            out.append((name, shape, str(self.dtype).removeprefix("torch.")))
        return out

    def init_weight_sync(self, host: str, port: int, world_size: int, backend: str, timeout_s: float, name: str) -> bool:
        if self.rank == 0:
            self.sender = WeightSender(host=host, port=port, world_size=world_size, backend=backend, timeout_s=timeout_s, name=name)
        return True

    def send_weights(self, bucket_mb: float = 0.0, sample: bool = True) -> dict[str, float]:
        """Broadcast the current weights to every engine (rank 0 sends; ZeRO-3 ranks all take part in gathers),
        packed into buckets of ``bucket_mb`` MB (``sync.bucket_mb``; 0: one broadcast per parameter); ``sample``:
        also return the read-back's sample of each tensor (``sync.check``; :meth:`WeightSender.send`)."""
        if self.sender is None:
            for _ in self._sync_weights():  # ZeRO-3: every rank must join each gather
                pass
            return {}
        return self.sender.send(self._sync_weights(), bucket_mb, sample=sample)

    def probe_logprobs(self, prompt_ids: list[int], continuations: list[list[int]]) -> list[list[float]]:
        """Log-probabilities (nats, temperature 1) of tokens 1.. of ``prompt_ids + continuations[e]``:
        [E][P - 1 + n_e], through :meth:`compute_logprobs` (the forward of the update's old logprobs). The sync
        probe (:mod:`rlvr.sync.probe`) compares them with the engines'. Every rank must call it (ZeRO-3 gathers)."""
        # the whole sequence after its first token is the "response": pack's loss mask then covers tokens 1..
        p = len(prompt_ids)
        seqs = [Completion(prompt_index=0, sample_index=i, prompt_ids=list(prompt_ids[:1]),
                           token_ids=list(prompt_ids[1:]) + list(c), logprobs=[0.0] * (p - 1 + len(c)), text="",
                           finish_reason="length", policy_version=self.version)
                for i, c in enumerate(continuations)]  # fmt: skip
        batch = pack(seqs, torch.zeros(len(seqs)), pad_id=0, max_new_tokens=p - 1 + max(len(c) for c in continuations))
        lp = self.compute_logprobs(batch, temperature=1.0)  # [E, S-1]: greedy probe logprobs are at T = 1
        return [lp[i, : p - 1 + len(c)].tolist() for i, c in enumerate(continuations)]

    def state_checksum(self) -> float:
        """float64 sum over all parameters (tests: did the update change the weights?)."""
        return float(sum(float(t.double().sum()) for _, t in self._named_weights()))

    def save_pretrained(self, out_dir: str) -> str:
        """Save the policy in Hugging Face format (safetensors + config + tokenizer files, with the run's chat
        template: ``data.chat_template_path``'s when set) under ``out_dir``; under
        LoRA the merged weights (:meth:`_named_weights`), and the PEFT adapter folder in ``out_dir/adapter``
        (``adapter_config.json``, ``adapter_model.safetensors``: ``PeftModel.from_pretrained(base, that folder)``)."""
        state = {n: t.cpu() for n, t in self._named_weights()}
        if self.rank != 0:
            return out_dir
        return write_pretrained(lora.inner(self.module), state, out_dir, self.model_dir, self.recipe,
                                self.module if self.lora else None)

    # -- checkpoints -----------------------------------------------------------------------------------------------
    def save_state(self, out_dir: str, background: bool = False) -> str:
        """Write this rank's share of a checkpoint under ``out_dir`` (every rank must call it); ``background``
        (torch backend): snapshot it and write it on a thread (:mod:`rlvr.train.ckpt_write`), then
        :meth:`wait_saved` (DeepSpeed writes now either way):

        - DeepSpeed: ``engine.save_checkpoint(out_dir, tag="ds")`` (module, fp32 master weights and optimizer
          partitions, one file per rank; rank 0 writes ``latest``); torch: ``torch_state.pt`` (weights, AdamW);
          under LoRA the module's weights are the adapters' alone (and AdamW's state is theirs);
        - ``rng_rank{k}.json``: this rank's RNG states (DeepSpeed saves none);
        - rank 0: the policy in Hugging Face format under ``out_dir/hf`` (what ``rlvr eval`` and vLLM load).
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        client = {"version": self.version}
        (out / f"rng_rank{self.rank}.json").write_text(json.dumps(rng_state()))
        if self.ds:
            # under LoRA the adapters alone (the frozen base weights are the model folder's)
            self.engine.save_checkpoint(str(out), tag="ds", client_state=client, exclude_frozen_parameters=self.lora)
            self.save_pretrained(str(out / "hf"))
            return str(out)
        scaler = {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}
        weights = lora.adapter_state(self.module) if self.lora else self.module.state_dict()
        state = {"model": weights, "optimizer": self.optimizer.state_dict(), **scaler, **client}
        hf = {n: t.cpu() for n, t in self._named_weights()}
        if background:  # copies now; the files on a thread while the run goes on
            state, hf = (host_copy(state), host_copy(hf)) if self.rank == 0 else (None, None)
        inner, adapter = lora.inner(self.module), self.module if self.lora else None

        def write() -> None:
            if self.rank == 0:
                torch.save(state, out / "torch_state.pt")
                write_pretrained(inner, hf, str(out / "hf"), self.model_dir, self.recipe, adapter)

        if background:
            self._writer = Writer(write, f"checkpoint {out.name}")
        else:
            write()
        return str(out)

    def wait_saved(self) -> bool:
        """Wait for :meth:`save_state`'s writing in the background (if any) to end. Errors: what it raised."""
        writer, self._writer = getattr(self, "_writer", None), None
        if writer is not None:
            writer.wait()
        return True

    def load_state(self, ckpt_dir: str) -> int:
        """Restore what :meth:`save_state` wrote (every rank); returns the policy version. The optimizer settings
        of this worker's recipe (``trainer.lr``, ``betas``, ``weight_decay``, ``grad_clip``) then replace the
        checkpoint's (:func:`apply_optimizer_settings`; DeepSpeed ZeRO-1/2 and fp16 also restore the saved
        clipping norm), so a resumed run may change them.
        Errors: ``FileNotFoundError`` when this rank's files are missing (a checkpoint of another world size)."""
        src, tr = Path(ckpt_dir), self.recipe.trainer
        if self.ds:
            path, client = self.engine.load_checkpoint(str(src), tag="ds", load_module_strict=not self.lora)
            if path is None:
                raise FileNotFoundError(f"{src}: no DeepSpeed checkpoint (tag 'ds') for rank {self.rank}")
            self.version = int(client["version"])
            if isinstance(self.optimizer, _FiniteAdamW):  # ZeRO-0 fp32: the optimizer clips (DeepSpeed does not)
                self.optimizer.grad_clip = tr.grad_clip
            elif hasattr(self.optimizer, "clip_grad"):  # DeepSpeed's wrappers: the clip norm is in their state
                self.optimizer.clip_grad = tr.grad_clip
        else:
            state = torch.load(src / "torch_state.pt", map_location=self.device, weights_only=False)
            if self.lora:
                lora.load_adapter_state(self.module, state["model"])
            else:
                self.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scaler is not None and "scaler" in state:
                self.scaler.load_state_dict(state["scaler"])
            self.version = int(state["version"])  # grad_clip: read from the recipe at every step
        changes = apply_optimizer_settings(self.optimizer, lr=tr.lr, betas=tr.betas, weight_decay=tr.weight_decay)
        if changes and self.rank == 0:
            log.info("optimizer state of %s loaded; from the recipe: %s", src,
                     ", ".join(f"{k} {old} -> {new}" for k, old, new in changes))  # fmt: skip
        set_rng_state(json.loads((src / f"rng_rank{self.rank}.json").read_text()))
        return self.version

    def ping(self) -> bool:
        return True
