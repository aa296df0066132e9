"""Recipe schema: typed, frozen dataclasses read from YAML, with dotted CLI overrides. A leaf module: it imports
neither torch nor the algorithms.

A recipe is a YAML mapping whose sections match :class:`Recipe`'s fields. Unknown keys are errors that name
the nearest valid key. Named registry entries (:class:`Spec`: ``algorithm.advantage``, ``algorithm.policy_loss``)
carry their own settings, declared next to their functions in ``rlvr/algos/``. :func:`read_recipe` builds a recipe
by this schema; :func:`rlvr.recipe.load_recipe` (what to call) also resolves each entry's settings and checks the
invariants, each with a message that says how to fix it. Nothing reads a config value through a hidden default:
every default is a field default here or in an entry's settings.

Errors: :class:`RecipeError` (a ``ValueError``) for every problem found in a recipe or an override.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class RecipeError(ValueError):
    """A recipe or override is malformed; the message names the key and the fix."""


from rlvr.config_sections import (  # noqa: F401 - the sections, re-exported: `from rlvr.config import DataConfig`
    ENV_SOURCE, AlgorithmConfig, CheckpointConfig, CriticConfig, DataConfig, EnvironmentConfig, EnvRowsConfig,
    GeneratedTaskConfig,
    JudgeConfig, MetricsConfig, ModelConfig, RewardConfig, RolloutConfig, RunConfig, Spec, SyncConfig, TimeoutsConfig,
    TeacherConfig, ToolsConfig, TrainerConfig, TrainerLoraConfig, ValidationConfig, VerifierSpec,
)


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """A whole training recipe; see the field classes for each section."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)

    # -- derived quantities (no state of their own) -------------------------------------------------------
    @property
    def samples_per_step(self) -> int:
        """B = P x G sequences generated per step."""
        return self.rollout.prompts_per_step * self.rollout.samples_per_prompt

    @property
    def mini_batch(self) -> int:
        """Sequences per optimizer step."""
        return self.trainer.mini_batch_size or self.samples_per_step

    @property
    def optimizer_steps_per_rollout(self) -> int:
        """Optimizer steps taken on each rollout batch: epochs x (B / mini-batch)."""
        return self.algorithm.ppo_epochs * (self.samples_per_step // self.mini_batch)

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches accumulated per optimizer step per rank."""
        per_rank = self.mini_batch // self.trainer.num_workers
        return max(1, per_rank // self.trainer.micro_batch_size)

    @property
    def response_budget(self) -> tuple[str, int]:
        """(key, tokens) of what may follow a prompt: ``environment.max_tokens`` (a multi-turn trajectory's
        sampled, environment and template tokens) with an environment, else ``rollout.max_new_tokens``."""
        if self.environment.enabled or self.tools.enabled:
            return "environment.max_tokens", self.environment.max_tokens
        return "rollout.max_new_tokens", self.rollout.max_new_tokens

    @property
    def max_sequence_tokens(self) -> int:
        """The longest sequence an engine or the trainer sees: ``data.max_prompt_tokens`` + the response budget."""
        return self.data.max_prompt_tokens + self.response_budget[1]

    @property
    def pass_k(self) -> tuple[int, ...]:
        """k values reported for pass@k."""
        return self.metrics.pass_k or default_ks(self.rollout.samples_per_prompt)

    def derived(self) -> dict[str, Any]:
        """Derived quantities printed at start and saved beside the recipe."""
        return {
            "prompts_per_step": self.rollout.prompts_per_step,
            "samples_per_step": self.samples_per_step,
            "max_tokens_per_step": self.samples_per_step * self.max_sequence_tokens,
            "mini_batch_size": self.mini_batch,
            "optimizer_steps_per_rollout_batch": self.optimizer_steps_per_rollout,
            "grad_accum_steps_per_rank": self.grad_accum_steps,
            "pass_k": list(self.pass_k),
            "total_samples": self.samples_per_step * self.run.steps,
        }


def default_ks(n: int) -> tuple[int, ...]:
    """k values reported for n samples: 1, every power of 2 below n, and n (n=6: 1, 2, 4, 6)."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return tuple(ks)


@dataclass(frozen=True)
class GpuProcess:
    """One process of a run that may hold a GPU: ``role`` (``trainer``, ``engine``: one rollout engine worker,
    ``teacher``, ``judge``), ``section`` (the recipe section of its settings), ``fraction`` (its ``num_gpus``;
    0: on CPU) and ``share`` (a vLLM engine's ``gpu_memory_utilization``, the share of the card it takes; 0 for a
    trainer rank)."""

    role: str
    section: str
    fraction: float
    share: float = 0.0


def gpu_processes(recipe: Recipe, *, teacher: bool, judge: bool = False) -> list[GpuProcess]:
    """The processes of ``recipe`` that hold devices, in the order the memory plan places them
    (:func:`rlvr.runtime.memory._place`): the trainer ranks (``trainer.num_workers``), the rollout engines' workers
    (``rollout.num_engines`` x ``tensor_parallel_size``, vLLM only: the ``hf`` engine reserves no share), then, where
    asked, the distillation teacher's engine and the judge's engine (one worker each). The memory plan models the
    first three (:func:`rlvr.runtime.memory.memory_plan`); the recipe check of GPU sharing
    (:func:`rlvr.recipe.gpu_sharing_errors`) all four. Here, beside the schema, so that both read it from below."""
    tr, ro = recipe.trainer, recipe.rollout
    out = [GpuProcess("trainer", "trainer", tr.num_gpus)] * tr.num_workers
    engines = ro.num_engines * ro.tensor_parallel_size if ro.engine == "vllm" else 0
    out += [GpuProcess("engine", "rollout", ro.num_gpus, ro.gpu_memory_utilization)] * engines
    if teacher:
        out.append(GpuProcess("teacher", "teacher", recipe.teacher.num_gpus, recipe.teacher.gpu_memory_utilization))
    if judge:
        out.append(GpuProcess("judge", "judge", recipe.judge.num_gpus, recipe.judge.gpu_memory_utilization))
    return out


# ------------------------------------------------------------------------------------------------------
# loading


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


FOREIGN_NAMES: dict[str, str] = {
    "learning_rate": "trainer.lr",
    "num_generations": "rollout.samples_per_prompt",
    "n_samples_per_prompt": "rollout.samples_per_prompt",
    "max_completion_length": "rollout.max_new_tokens",
    "max_tokens": "rollout.max_new_tokens",
    "max_prompt_length": "data.max_prompt_tokens",
    "beta": "algorithm.kl_coef",
    "kl_loss_coef": "algorithm.kl_coef",
    "num_iterations": "algorithm.ppo_epochs",
    "epsilon": "algorithm.policy_loss.clip_low",
    "epsilon_high": "algorithm.policy_loss.clip_high",
    "max_grad_norm": "trainer.grad_clip",
    "adv_estimator": "algorithm.advantage",
    "rollout.n": "rollout.samples_per_prompt",  # verl (qualified: a bare `n` elsewhere means something else)
    "ppo_micro_batch_size_per_gpu": "trainer.micro_batch_size",
    "use_remove_padding": "trainer.packing",  # verl
    "packing_samples": "trainer.packing",  # OpenRLHF
    "total_training_steps": "run.steps",
}
"""Names TRL, verl and OpenRLHF use for settings rlvr names otherwise (used only for error hints)."""

REMOVED_KEYS: dict[str, str] = {
    "run.torch_threads": "threads are set per role: rollout.threads, trainer.threads, critic.threads",
    "model.trust_remote_code": (
        "rlvr loads only architectures built into transformers and vLLM (code from the hub could change the "
        "logits the trainer computes without the engine knowing); use a model whose architecture transformers "
        "ships (Qwen2.5, Llama, SmolLM2, ...)"
    ),
}
"""Keys other frameworks (or older rlvr recipes) have that rlvr deliberately does not: the reason, for the error."""

MOVED_KEYS: dict[str, str] = {
    "algorithm.std_normalize": "advantage: {name: grpo, std_normalize: false} (algorithm.advantage.std_normalize)",
    "algorithm.passk_k": "advantage: {name: passk, k: 4} or {name: pkpo, k: 4} (algorithm.advantage.k)",
    "algorithm.pkpo_baseline": "advantage: {name: pkpo, k: 4, baseline: loo} (algorithm.advantage.baseline)",
    "algorithm.clip_low": "policy_loss: {name: ppo_clip, clip_low: 0.2} (algorithm.policy_loss.clip_low)",
    "algorithm.clip_high": "policy_loss: {name: ppo_clip, clip_high: 0.28} (algorithm.policy_loss.clip_high)",
    "algorithm.dual_clip_c": "policy_loss: {name: ppo_clip, dual_clip_c: 3} (algorithm.policy_loss.dual_clip_c)",
    "algorithm.gspo_clip_low": "policy_loss: {name: gspo, clip_low: 3.0e-4} (algorithm.policy_loss.clip_low)",
    "algorithm.gspo_clip_high": "policy_loss: {name: gspo, clip_high: 4.0e-4} (algorithm.policy_loss.clip_high)",
    "algorithm.cispo_clip_low": "policy_loss: {name: cispo, clip_low: 1.0} (algorithm.policy_loss.clip_low)",
    "algorithm.cispo_clip_high": "policy_loss: {name: cispo, clip_high: 4.0} (algorithm.policy_loss.clip_high)",
    "algorithm.gamma": "advantage: {name: gae, gamma: 1.0} (algorithm.advantage.gamma)",
    "algorithm.lam": "advantage: {name: gae, lam: 0.95} (algorithm.advantage.lam)",
    "algorithm.whiten_advantages": "advantage: {name: gae, whiten: true} (algorithm.advantage.whiten)",
    "algorithm.value_clip": "critic.value_clip",
}
"""Flat algorithm keys of rlvr before each method owned its settings: where each one lives now, for the error."""


def _unknown_key(where: str, key: str, valid: list[str]) -> RecipeError:
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    foreign = FOREIGN_NAMES.get(where + key) or FOREIGN_NAMES.get(key)
    if where + key in MOVED_KEYS:
        hint = f"each method owns its settings now: write {MOVED_KEYS[where + key]}"
    elif where + key in REMOVED_KEYS:
        hint = f"rlvr has no such setting: {REMOVED_KEYS[where + key]}"
    elif foreign:  # before fuzzy matching: num_generations is not num_engines
        hint = f"rlvr calls this '{foreign}'"
    elif near:
        hint = f"did you mean '{where}{near[0]}'?"
    else:
        hint = f"valid keys under '{where.rstrip('.') or '(top level)'}': {', '.join(valid)}"
    return RecipeError(f"unknown key '{where}{key}': {hint}")


def _spec(value: Any, where: str) -> Spec:
    """``"passk"`` or ``{name: passk, k: 4}`` (or an already built :class:`Spec`) -> ``Spec`` with the fields as a
    mapping (resolved against the entry's settings class by :func:`rlvr.recipe.load_recipe`)."""
    if isinstance(value, Spec):
        return value
    if isinstance(value, str):
        return Spec(value)
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        return Spec(value["name"], {k: v for k, v in value.items() if k != "name"})
    if isinstance(value, dict) and "name" in value:
        raise RecipeError(f"'{where}.name' must be a registered name (a string), got {value['name']!r}")
    raise RecipeError(f"'{where}' must be a registered name or a mapping with a name and that entry's settings, "
                      f"e.g. {where.rsplit('.', 1)[-1]}: {{name: ..., ...}}; got {value!r}")  # fmt: skip


def build_settings(cls: type, fields: dict[str, Any], where: str) -> Any:
    """An entry's settings dataclass from a recipe's mapping, fields converted and checked by type as every recipe
    section is. Errors: :class:`RecipeError` naming ``where`` + the field (an unknown one with its nearest name)."""
    return _build(cls, fields, where + ".")


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Spec:
        return _spec(value, where)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, (list, tuple, str)) and getattr(tp, "SHORTHAND", None):  # tools: [a, b]
            value = {tp.SHORTHAND: value}
        if not isinstance(value, dict):
            raise RecipeError(f"'{where}' must be a mapping of {tp.__name__} fields, got {value!r}")
        return _build(tp, value, where + ".")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(value, a, where)
            except RecipeError as e:
                errors.append(str(e))
        raise RecipeError(errors[0] if errors else f"'{where}': bad value {value!r}")
    if origin is Literal:
        if value not in args:
            near = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise RecipeError(f"'{where}' must be one of {list(args)}, got {value!r}{hint}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            value = [value]
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise RecipeError(f"'{where}' must have {len(args)} items, got {value!r}")
        return tuple(_convert(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        if not isinstance(value, dict):
            raise RecipeError(f"'{where}' must be a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise RecipeError(f"'{where}' must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise RecipeError(f"'{where}' must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-5 as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise RecipeError(f"'{where}' must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise RecipeError(f"'{where}' must be a string, got {value!r}")
    return value


def _build(cls: type, data: dict[str, Any], where: str = "") -> Any:
    ftypes = _field_types(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in ftypes:
            raise _unknown_key(where, str(key), list(ftypes))
        kwargs[key] = _convert(value, ftypes[key], where + key)
    required = [f.name for f in dataclasses.fields(cls) if f.name not in kwargs and f.init
                and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]  # fmt: skip
    if required:
        raise RecipeError(f"'{where}{required[0]}' is required (it has no default): set it")
    return cls(**kwargs)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last one silently: a second
    ``run:`` block would replace the first whole)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise RecipeError(f"key {key!r} is given twice in one mapping (lines {seen[key] + 1} and "
                                  f"{key_node.start_mark.line + 1}): keep one")  # fmt: skip
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b.c = value`` in the raw recipe tree. A section with a shorthand given a list (``tools=[a, b]``)
    sets its shorthand key only, keeping the recipe's other settings of it. A :class:`Spec` field takes a name
    (replacing the whole entry, its settings back to defaults) or, one level down, one of its entry's settings (``algorithm.advantage.k=8``:
    a bare name in the tree becomes ``{name: ..., k: 8}``; the field is checked when the recipe is resolved)."""
    cls: Any = Recipe
    node = tree
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        ftypes = _field_types(cls) if dataclasses.is_dataclass(cls) else None
        if ftypes is not None and part not in ftypes:
            raise _unknown_key(".".join(parts[:i]) + ("." if i else ""), part, list(ftypes))
        if i == len(parts) - 1:
            shorthand = getattr(ftypes[part], "SHORTHAND", None) if ftypes is not None else None
            if shorthand and isinstance(value, (list, tuple, str)) and isinstance(node.get(part), dict):
                node[part] = {**node[part], shorthand: value}  # tools=[a, b]: the names, the section's settings kept
                return
            node[part] = value
            return
        owner, cls = cls, (ftypes[part] if ftypes is not None else Any)
        nxt = node.get(part)
        if cls is Spec:
            if len(parts) - i != 2:
                raise RecipeError(f"override {dotted!r}: write {'.'.join(parts[:i + 1])}=NAME or "
                                  f"{'.'.join(parts[:i + 1])}.SETTING=VALUE")  # fmt: skip
            if nxt is None:  # the field's default entry (AlgorithmConfig.advantage: grpo)
                nxt = next(f.default for f in dataclasses.fields(owner) if f.name == part).name
            if isinstance(nxt, str):
                nxt = {"name": nxt}
            if not isinstance(nxt, dict):
                raise RecipeError(f"override {dotted!r}: {'.'.join(parts[:i + 1])} is {nxt!r}, not a name or mapping")
            node[part] = nxt
            nxt[parts[-1]] = value
            return
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt


def _replaces_spec(dotted: str) -> bool:
    """True when ``dotted`` names a :class:`Spec` field itself (``algorithm.advantage``), not one of its settings."""
    parts = dotted.split(".")
    try:
        return _field_types(_owner(parts[:-1])).get(parts[-1]) is Spec
    except (KeyError, TypeError):
        return False


def _owner(path: list[str]) -> type:
    """The dataclass at ``path`` (a list of field names) below :class:`Recipe`."""
    cls: Any = Recipe
    for part in path:
        cls = _field_types(cls)[part]
    return cls


def parse_override(text: str) -> tuple[str, Any]:
    """``"trainer.lr=1e-6"`` -> ``("trainer.lr", 1e-6)``; the value is read as YAML.

    Errors: :class:`RecipeError` when ``=`` is missing (a usage message) or the value is not valid YAML.
    """
    if "=" not in text:
        raise RecipeError(f"override {text!r} must look like section.key=value (e.g. trainer.lr=1e-6)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not raw.strip():
        return key, ""
    try:
        return key, yaml.safe_load(raw)
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0]
        raise RecipeError(f"override {key!r}: value {raw!r} is not valid YAML ({first}); quote it or fix it") from None


def read_recipe(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Read a recipe YAML, apply ``section.key=value`` overrides and build it by the schema (types, unknown keys,
    ``model.dtype: auto`` and ``trainer.backend: auto`` resolved). Named entries (:class:`Spec`) keep the recipe's fields as a mapping and no
    invariant is checked: :func:`rlvr.recipe.load_recipe` does both (use that one).

    Errors: :class:`RecipeError` naming the key and the fix; ``FileNotFoundError`` for a missing file.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        try:
            loaded = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
        except yaml.YAMLError as e:
            raise RecipeError(f"{path}: not valid YAML: {e}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise RecipeError(f"{path}: a recipe must be a YAML mapping of sections (run:, model:, ...)")
        tree = loaded or {}
    parsed = [parse_override(ov) for ov in overrides]
    # a name replacing a whole entry (algorithm.advantage=passk) goes before the entry's settings
    # (algorithm.advantage.k=2), so the order of overrides on the command line does not matter
    for key, value in sorted(parsed, key=lambda kv: not _replaces_spec(kv[0])):
        _set_dotted(tree, key, value)
    recipe = _build(Recipe, tree)
    if recipe.model.dtype == "auto":
        from rlvr.hardware import fast_dtype

        dtype = fast_dtype(recipe.trainer.num_gpus)
        recipe = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, dtype=dtype))
    if recipe.judge.dtype == "auto":
        from rlvr.hardware import fast_dtype

        recipe = dataclasses.replace(recipe, judge=dataclasses.replace(recipe.judge, dtype=fast_dtype(recipe.judge.num_gpus)))
    if recipe.teacher.dtype == "auto":
        from rlvr.hardware import fast_dtype

        teacher = dataclasses.replace(recipe.teacher, dtype=fast_dtype(recipe.teacher.num_gpus))
        recipe = dataclasses.replace(recipe, teacher=teacher)
    if recipe.trainer.backend == "auto":
        backend = "torch" if recipe.trainer.num_workers == 1 else "deepspeed"
        recipe = dataclasses.replace(recipe, trainer=dataclasses.replace(recipe.trainer, backend=backend))
    return recipe


def plain(obj: Any) -> Any:
    """Any config dataclass (a recipe, a section, ``rlvr eval``'s settings) as plain data: dataclasses as dicts,
    tuples as lists, a :class:`Spec` as ``{name: ..., **settings}`` (the form a recipe is written in)."""
    if isinstance(obj, Spec):
        return {"name": obj.name, **(plain(obj.settings) if obj.settings is not None else {})}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    return obj


def to_dict(recipe: Recipe) -> dict[str, Any]:
    """The resolved recipe as plain data (tuples as lists; a :class:`Spec` as ``{name: ..., **settings}``), for
    YAML/JSON; :func:`rlvr.recipe.load_recipe` reads it back to the same recipe."""
    return json.loads(json.dumps(plain(recipe)))


def dump_yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(to_dict(recipe), sort_keys=False)
