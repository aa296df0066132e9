"""What ``rlvr serve`` does for each Tinker API call, apart from HTTP (:mod:`rlvr.serve.app` maps routes here).

Sessions, training models (each one :class:`~rlvr.serve.models.ModelRun`: its own trainer and engines, built from
a recipe made of the server's options), sampling sessions, checkpoints and futures. Each method takes the request
body as the SDK sends it (a dict, validated with the SDK's own pydantic request types) and returns the response
body, or raises :class:`ApiError` (an HTTP status and a message naming the field and the fix).

Paths: ``tinker://<model_id>/weights/<name>`` (training state: weights and optimizer) and
``tinker://<model_id>/sampler_weights/<name>``; state lives under ``--state-dir``, so a checkpoint saved by one
server process loads in the next.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.serve.futures import Futures, Result, UserError
from rlvr.serve.models import ModelRun, SampleBatcher, SampleJob
from rlvr.types import SamplingConfig

log = logging.getLogger(__name__)


MAX_THREADS = 8
"""Torch threads of each model's trainer and of each engine: every core, at most this many (sampling and training
take turns in a loop like the cookbook's, so each may use all of them)."""


class ApiError(Exception):
    """An HTTP error answer: ``status`` and a message for the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    """``rlvr serve``'s settings (its command-line options)."""

    model: str = "smollm2-135m-instruct"
    """The base model: an embedded name, a local folder or a hub id (:func:`rlvr.models.resolve_model`)."""
    name: str = ""
    """The name clients ask for (``base_model``); "" : the model's own name (its folder's ``_name_or_path``)."""
    full: bool = False
    """Serve every training client as full fine-tuning (all weights trained), whatever LoRA rank it asks for."""
    host: str = "127.0.0.1"
    port: int = 8000
    state_dir: str = "runs/serve"
    """Checkpoints and role logs."""
    max_context: int = 2048
    """Longest sequence (prompt + sampled tokens, or a training datum) the engines and trainer take."""
    overrides: tuple[str, ...] = ()
    """Recipe settings for each model's roles (``trainer.backend=deepspeed``, ``rollout.engine=hf``, ...)."""
    op_timeout_s: float = 900.0
    """Deadline of one operation (a forward_backward, a sync, one engine call) and of a model's start."""
    poll_s: float = 30.0
    """How long one ``retrieve_future`` waits for a result before answering "try again"."""
    session_timeout_s: float = 120.0
    """A session with no heartbeat for this long is over: its models are unloaded (a client that disappeared; the
    SDK sends one every 10 s while its process lives), at the reaper's next look (every min(30 s, a quarter of
    this))."""
    max_models: int = 2
    """Training models held at once (each has its own trainer and engines)."""
    api_key: str = ""
    """When set, requests must carry it (``X-API-Key`` or ``Authorization: Bearer``); "" accepts any."""


@dataclass
class _Session:
    last_seen: float
    models: list[str] = field(default_factory=list)


def _validate(cls: Any, body: dict, route: str) -> Any:
    from pydantic import ValidationError

    try:
        return cls.model_validate(body)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()[:5])
        raise ApiError(400, f"{route}: malformed request ({problems})") from e


def parse_path(path: str, kind: str) -> tuple[str, str]:
    """``tinker://<model_id>/<kind>/<name>`` -> (model_id, name). Errors: :class:`UserError`."""
    parts = path[len("tinker://"):].split("/") if path.startswith("tinker://") else []
    if len(parts) != 3 or parts[1] != kind or not parts[0] or not parts[2]:
        raise UserError(f"{path!r} is not a path of this server's {kind} (tinker://<model_id>/{kind}/<name>)")
    return parts[0], parts[2]


class Server:
    """The state of one ``rlvr serve`` process (thread-safe: HTTP handlers run on an event loop, work on lanes)."""

    def __init__(self, opts: ServeOptions) -> None:
        from rlvr.models import resolve_model

        self.opts = opts
        self.model_dir = resolve_model(opts.model)
        self.name = opts.name or model_name_of(self.model_dir, opts.model)
        self.state_dir = Path(opts.state_dir).resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.futures = Futures()
        self.sessions: dict[str, _Session] = {}
        self.models: dict[str, ModelRun] = {}
        self.batchers: dict[str, SampleBatcher] = {}
        self.building: set[str] = set()  # model ids being built: they count against --max-models
        self.sampling: dict[str, tuple[str, int, str | None]] = {}  # sampling session id -> (model, version, path)
        self.lock = threading.RLock()
        self.keeper = None  # the Ray executor kept for the server's life (models come and go; Ray stays up)
        self.recipe(0)  # the options make a valid recipe, or the server does not start
        self._stop = threading.Event()
        # threads that unload models (a session's finish, the reaper): close() waits for them, so that no model's
        # roles are still stopping when the process exits (an interpreter that exits while a daemon thread is
        # inside an in-process vLLM engine's shutdown aborts: "terminate called without an active exception")
        self._unloaders: list[threading.Thread] = []
        self._background(self._reap, "serve-reaper")

    # -- recipes and models ----------------------------------------------------------------------------------------
    def recipe(self, lora_rank: int, model_id: str = "check", targets: tuple[str, ...] = ()) -> Any:
        """The recipe of one model's roles: the server's options, the LoRA rank and target modules (``()``: the
        recipe's default, attention and MLP), then ``overrides``. Errors: ``RecipeError``."""
        from rlvr.recipe import load_recipe

        # --max-context split into the recipe's prompt and sampled-token limits: the engines' context is their sum,
        # which one request may share between its prompt and its samples in any proportion
        half = max(1, self.opts.max_context // 2)
        threads = min(MAX_THREADS, os.cpu_count() or 1)
        base = [f"model.path={self.opts.model}", f"trainer.lora.rank={lora_rank}",
                f"data.max_prompt_tokens={self.opts.max_context - half}", f"rollout.max_new_tokens={half}",
                "reward.num_workers=1", "metrics.progress=false", f"run.output_dir={self.state_dir}",
                f"run.name={model_id}", "rollout.prompts_per_step=1", "rollout.samples_per_prompt=2",  # unread here
                f"timeouts.startup_s={self.opts.op_timeout_s}", f"trainer.threads={threads}",
                f"rollout.threads={threads}"]  # fmt: skip
        if targets:
            base.append(f"trainer.lora.target_modules=[{','.join(targets)}]")
        return load_recipe(None, base + list(self.opts.overrides))

    def _start_model(self, session_id: str, lora_rank: int, model_id: str, targets: tuple[str, ...] = ()) -> ModelRun:
        from rlvr.runtime.roles import Roles, default_executor
        from rlvr.serve.trainer import ServeTrainer

        r = self.recipe(lora_rank, model_id, targets)
        run_dir = self.state_dir / model_id
        run_dir.mkdir(parents=True, exist_ok=True)
        if r.run.executor == "ray" and self.keeper is None:
            self.keeper = default_executor(r, run_dir)
        t0 = time.perf_counter()
        roles = Roles(r, self.model_dir, run_dir, trainer_cls=ServeTrainer)
        log.info("model %s ready in %.1fs (%s, %s trainer, %d %s engine(s))", model_id, time.perf_counter() - t0,
                 f"LoRA rank {lora_rank}" if lora_rank else "full fine-tuning", r.trainer.backend,
                 r.rollout.num_engines, r.rollout.engine)  # fmt: skip
        run = ModelRun(model_id, session_id, self.name, lora_rank, roles, self.state_dir, self.opts.op_timeout_s,
                       targets=targets)
        with self.lock:
            self.models[model_id] = run
            self.batchers[model_id] = SampleBatcher(run, self.futures)
            session = self.sessions.get(session_id)
            if session is not None:
                session.models.append(model_id)
        if session is None:  # the session ended (its client went away) while the model was built
            self.unload(model_id)
            raise UserError(f"session {session_id} ended while model {model_id} was being built (no heartbeat for "
                            f"{self.opts.session_timeout_s:.0f}s): the model was unloaded")
        return run

    def _reserve(self, session_id: str, model_id: str, route: str) -> None:
        """Count ``model_id`` against ``--max-models`` from now (its build runs later). Errors: :class:`ApiError`
        404 for an unknown session (its model could never be unloaded), 429 when the server holds its limit."""
        with self.lock:
            if session_id not in self.sessions:
                raise ApiError(404, f"{route}: unknown session {session_id!r} (create one first: a ServiceClient "
                                    "does; sessions end after --session-timeout-s without a heartbeat)")
            held = len(self.models) + len(self.building)
            if held >= self.opts.max_models:
                raise ApiError(429, f"{route}: {held} models are loaded or being built, the server's limit "
                                    "(--max-models); unload one or wait for its session to end")
            self.building.add(model_id)

    def _build(self, session_id: str, rank: int, model_id: str, targets: tuple[str, ...]) -> ModelRun:
        """:meth:`_start_model` for a reserved ``model_id``; the reservation ends whatever happens."""
        try:
            return self._start_model(session_id, rank, model_id, targets)
        finally:
            with self.lock:
                self.building.discard(model_id)

    def model(self, model_id: str) -> ModelRun:
        with self.lock:
            run = self.models.get(model_id)
        if run is None:
            raise ApiError(404, f"unknown model_id {model_id!r} (this server holds {sorted(self.models) or 'none'}; "
                                "a model is unloaded when its session ends)")
        return run

    def unload(self, model_id: str) -> None:
        with self.lock:
            run = self.models.pop(model_id, None)
            batcher = self.batchers.pop(model_id, None)
            self.sampling = {k: v for k, v in self.sampling.items() if v[0] != model_id}
        if batcher is not None:
            batcher.close()
        if run is not None:
            run.roles.shutdown()
            log.info("model %s unloaded", model_id)
        self.futures.drop_lane(model_id)

    # -- sessions ------------------------------------------------------------------------------------------------
    def create_session(self, body: dict) -> dict:
        from tinker import types

        _validate(types.CreateSessionRequest, body, "create_session")
        sid = f"s-{uuid.uuid4().hex[:12]}"
        with self.lock:
            self.sessions[sid] = _Session(time.monotonic())
        return {"type": "create_session", "session_id": sid}

    def heartbeat(self, body: dict) -> dict:
        sid = str(body.get("session_id", ""))
        with self.lock:
            s = self.sessions.get(sid)
            if s is None:
                raise ApiError(404, f"unknown session {sid!r} (ended after {self.opts.session_timeout_s:.0f}s "
                                    "without a heartbeat, or never created)")
            s.last_seen = time.monotonic()
        return {"type": "session_heartbeat"}

    def finish_session(self, session_id: str) -> dict:
        """``POST /api/v1/sessions/<id>/finish`` (``ServiceClient.close()``): the session ends and its models are
        unloaded now. An unknown session is no error (closing twice)."""
        with self.lock:
            s = self.sessions.pop(session_id, None)
        for m in s.models if s is not None else []:
            self._background(self.unload, f"serve-unload-{m}", m)
        return {}

    def _touch(self, sid: str | None) -> None:
        with self.lock:
            if sid in self.sessions:
                self.sessions[sid].last_seen = time.monotonic()

    def _background(self, fn: Any, name: str, *args: Any) -> None:
        """Run ``fn(*args)`` on a daemon thread that :meth:`close` waits for."""
        t = threading.Thread(target=fn, args=args, name=name, daemon=True)
        with self.lock:
            self._unloaders = [u for u in self._unloaders if u.is_alive()] + [t]
        t.start()

    def _reap(self) -> None:
        """Sessions without a heartbeat for ``session_timeout_s`` end, and their models are unloaded."""
        while not self._stop.wait(min(30.0, self.opts.session_timeout_s / 4)):
            now = time.monotonic()
            with self.lock:
                gone = [k for k, s in self.sessions.items() if now - s.last_seen > self.opts.session_timeout_s]
                models = [m for k in gone for m in self.sessions.pop(k).models]
            for m in models:
                log.warning("session of model %s sent no heartbeat for %.0fs: unloading it", m,
                            self.opts.session_timeout_s)
                self.unload(m)

    def capabilities(self) -> dict:
        return {"supported_models": [{"model_name": self.name, "max_context_length": self.opts.max_context,
                                      "trainable": True, "sampleable": True}]}  # fmt: skip

    # -- training models -----------------------------------------------------------------------------------------
    def create_model(self, body: dict) -> dict:
        from tinker import types

        req = _validate(types.CreateModelRequest, body, "create_model")
        self._check_base(req.base_model)
        if req.lora_config is None and not self.opts.full:
            raise ApiError(400, "create_model: no lora_config; this server trains LoRA adapters (start it with "
                                "--full to serve full fine-tuning)")
        rank = 0 if self.opts.full else int(req.lora_config.rank)
        targets = lora_targets(req.lora_config) if rank else ()
        sid = req.session_id
        model_id = self._new_model_id(sid, req.model_seq_id)
        self._reserve(sid, model_id, "create_model")

        def build() -> dict:
            self._build(sid, rank, model_id, targets)
            return {"type": "create_model", "model_id": model_id}

        rid = self.futures.submit("create", "create_model", build)
        return {"request_id": rid, "model_id": model_id}

    def _new_model_id(self, session_id: str, model_seq_id: int | None) -> str:
        """``<session_id>:train:<model_seq_id>``: the id the SDK itself derives when it creates a model by loading
        a checkpoint (``ServiceClient.create_training_client_from_state``). Errors: :class:`ApiError` 400 when a
        model of that id is loaded."""
        model_id = f"{session_id}:train:{model_seq_id if model_seq_id is not None else uuid.uuid4().hex[:8]}"
        with self.lock:
            if model_id in self.models:
                raise ApiError(400, f"model {model_id} exists already (model_seq_id {model_seq_id} of session "
                                    f"{session_id} was used)")
        return model_id

    def _check_base(self, base_model: str | None) -> None:
        if base_model and base_model not in (self.name, self.opts.model):
            raise ApiError(400, f"base_model {base_model!r} is not served here: this server serves {self.name!r} "
                                f"(rlvr serve --model {self.opts.model})")

    def get_info(self, body: dict) -> dict:
        run = self.model(str(body.get("model_id", "")))
        return {"type": "get_info", "model_id": run.model_id, "model_name": run.base_model,
                "is_lora": run.lora_rank > 0, "lora_rank": run.lora_rank or None,
                "model_data": {"arch": "causal_lm", "model_name": run.base_model, "tokenizer_id": self.tokenizer_id}}

    @property
    def tokenizer_id(self) -> str:
        """What the SDK's ``get_tokenizer()`` loads: the model folder itself when the server listens on this
        machine only (its clients share the disk, and need no hub), else the model's name."""
        return self.model_dir if self.opts.host in ("127.0.0.1", "localhost", "::1") else self.name

    def forward_backward(self, body: bytes, encoding: str | None) -> dict:
        from rlvr.serve.wire import WireError, decode_forward_backward, encode_forward_backward_output

        try:
            call = decode_forward_backward(body, encoding)
        except WireError as e:
            raise ApiError(400, str(e)) from e
        run = self.model(call.model_id)
        self._touch(run.session_id)
        for i, (tokens, _) in enumerate(call.data):
            if len(tokens) > self.opts.max_context:
                raise ApiError(400, f"forward_backward: datum {i} has {len(tokens)} input tokens, over the server's "
                                    f"--max-context {self.opts.max_context} (cut the datum, or start the server with a "
                                    "larger --max-context)")

        def job() -> Result:
            out = run.forward_backward(call.data, call.loss_fn, call.loss_fn_config, call.forward_only)
            return Result(value=encode_forward_backward_output(out["outputs"], out["metrics"]), proto=True)

        rid = self.futures.submit(run.model_id, "forward" if call.forward_only else "forward_backward", job)
        return {"request_id": rid, "model_id": run.model_id}

    def optim_step(self, body: dict) -> dict:
        from tinker import types

        req = _validate(types.OptimStepRequest, body, "optim_step")
        run = self.model(req.model_id)
        if not isinstance(req.optim_params, types.AdamParams):
            raise ApiError(400, f"optim_step: optimizer {getattr(req.optim_params, 'type', '?')!r} is not served; "
                                "rlvr serve runs AdamW (send AdamParams)")
        adam = req.optim_params.model_dump()

        def job() -> dict:  # metrics: the trainer's grad_norm, applied, datums
            return {"type": "optim_step", "metrics": run.optim_step(adam)}

        return {"request_id": self.futures.submit(run.model_id, "optim_step", job), "model_id": run.model_id}

    def save_weights(self, body: dict) -> dict:
        from tinker import types

        req = _validate(types.SaveWeightsRequest, body, "save_weights")
        run = self.model(req.model_id)
        name = req.path or f"step-{run.trainer_version:06d}"
        if "/" in name or name in ("", ".", ".."):
            raise ApiError(400, f"save_weights: path {name!r} must be a plain name (no '/')")

        def job() -> dict:
            folder = run.save_state(name)
            log.info("model %s: state saved to %s", run.model_id, folder)
            return {"type": "save_weights", "path": f"tinker://{run.model_id}/weights/{name}"}

        return {"request_id": self.futures.submit(run.model_id, "save_weights", job), "model_id": run.model_id}

    def save_weights_for_sampler(self, body: dict) -> dict:
        from tinker import types

        req = _validate(types.SaveWeightsForSamplerRequest, body, "save_weights_for_sampler")
        run = self.model(req.model_id)
        if req.kind != "snapshot":
            raise ApiError(400, f"save_weights_for_sampler: kind {req.kind!r} is not served (snapshot only)")
        name = req.path
        if name is not None and ("/" in name or not name):
            raise ApiError(400, f"save_weights_for_sampler: path {name!r} must be a plain name (no '/')")

        def job() -> dict:
            run.push_to_engines()
            version = run.trainer_version
            with self.lock:
                if name is not None:
                    path = f"tinker://{run.model_id}/sampler_weights/{name}"
                    run.samplers[path] = version
                    return {"type": "save_weights_for_sampler", "path": path}
                ssid = f"ss-{uuid.uuid4().hex[:12]}"
                self.sampling[ssid] = (run.model_id, version, None)
            return {"type": "save_weights_for_sampler", "sampling_session_id": ssid}

        return {"request_id": self.futures.submit(run.model_id, "save_weights_for_sampler", job),
                "model_id": run.model_id}

    def load_weights(self, body: dict) -> dict:
        from tinker import types

        req = _validate(types.LoadWeightsRequest, body, "load_weights")
        try:
            src_model, name = parse_path(req.path, "weights")
        except UserError as e:
            raise ApiError(400, f"load_weights: {e}") from e
        folder = self.state_dir / src_model / "weights" / name
        meta_file = folder / "serve.json"
        if not meta_file.exists():
            raise ApiError(404, f"load_weights: no checkpoint at {req.path} (looked in {folder}; saved by save_state "
                                "of a server with the same --state-dir?)")
        meta = json.loads(meta_file.read_text())
        if req.model_id is not None:
            run = self.model(req.model_id)

            def job() -> dict:
                run.load_state(folder, req.optimizer)
                return {"type": "load_weights", "path": req.path, "model_id": run.model_id}

            return {"request_id": self.futures.submit(run.model_id, "load_weights", job), "model_id": run.model_id}
        if req.session_id is None:
            raise ApiError(400, "load_weights: give model_id (load onto a model) or session_id (a new model from the "
                                "checkpoint)")
        self._check_base(req.base_model or meta["base_model"])
        model_id = self._new_model_id(req.session_id, req.model_seq_id)
        rank = 0 if self.opts.full else int(meta["lora_rank"])
        self._reserve(req.session_id, model_id, "load_weights")

        def create_and_load() -> dict:
            run = self._build(req.session_id, rank, model_id, tuple(meta.get("targets", ())) if rank else ())
            run.load_state(folder, req.optimizer)
            return {"type": "load_weights", "path": req.path, "model_id": model_id}

        return {"request_id": self.futures.submit("create", "load_weights", create_and_load), "model_id": model_id}

    def unload_model(self, body: dict) -> dict:
        run = self.model(str(body.get("model_id", "")))

        def job() -> dict:
            self.unload(run.model_id)
            return {"type": "unload_model", "model_id": run.model_id}

        return {"request_id": self.futures.submit(run.model_id, "unload_model", job), "model_id": run.model_id}

    # -- sampling --------------------------------------------------------------------------------------------------
    def create_sampling_session(self, body: dict) -> dict:
        from tinker import types

        req = _validate(types.CreateSamplingSessionRequest, body, "create_sampling_session")
        model_id, version = self._sampler_of(req.model_path, req.base_model)
        ssid = f"ss-{uuid.uuid4().hex[:12]}"
        with self.lock:
            self.sampling[ssid] = (model_id, version, req.model_path)
        return {"type": "create_sampling_session", "sampling_session_id": ssid}

    def get_sampler(self, sampler_id: str) -> dict:
        """``GET /api/v1/samplers/<id>``: the base model and sampler path of a sampling session."""
        with self.lock:
            target = self.sampling.get(sampler_id)
        if target is None:
            raise ApiError(404, f"unknown sampler {sampler_id!r}")
        return {"sampler_id": sampler_id, "base_model": self.name, "model_path": target[2]}

    def _sampler_of(self, model_path: str | None, base_model: str | None) -> tuple[str, int]:
        """(model id, policy version) that a sampler path, or the base model, names."""
        if model_path:
            try:
                model_id, _ = parse_path(model_path, "sampler_weights")
            except UserError as e:
                raise ApiError(400, f"sampling: {e}") from e
            run = self.model(model_id)
            if model_path not in run.samplers:
                raise ApiError(404, f"sampling: no sampler weights at {model_path}")
            return model_id, run.samplers[model_path]
        self._check_base(base_model)
        with self.lock:  # the base model: the engines of a model that has not pushed new weights yet
            for run in self.models.values():
                if run.engine_version == 0:
                    return run.model_id, 0
        raise ApiError(400, "sampling the base model needs engines that still hold it: create a training client "
                            "first (its engines serve the base model until it saves weights for the sampler)")

    def asample(self, body: dict) -> dict:
        from tinker import types

        req = _validate(types.SampleRequest, body, "asample")
        if req.sampling_session_id is not None:
            with self.lock:
                target = self.sampling.get(req.sampling_session_id)
            if target is None:
                raise ApiError(404, f"asample: unknown sampling_session_id {req.sampling_session_id!r}")
            model_id, version = target[0], target[1]
        else:
            model_id, version = self._sampler_of(req.model_path, req.base_model)
        for field_name, value in (("topk_prompt_logprobs", req.topk_prompt_logprobs),
                                  ("topk_sample_logprobs", req.topk_sample_logprobs),
                                  ("prompt_alt_tokens_k", req.prompt_alt_tokens_k)):  # fmt: skip
            if value:
                raise ApiError(400, f"asample: {field_name} is not served by rlvr serve (leave it 0)")
        if req.target_prompt_logprobs is not None or req.record_stability_info:
            raise ApiError(400, "asample: target_prompt_logprobs and record_stability_info are not served")
        prompt = req.prompt.to_ints()
        sampling = self._sampling_config(req, len(prompt))
        run = self.model(model_id)
        self._touch(run.session_id)
        with self.lock:
            batcher = self.batchers.get(model_id)
        if batcher is None:
            raise ApiError(404, f"asample: model {model_id} is unloaded")
        last_n = req.prompt_logprobs_last_n
        if last_n is not None and not (req.prompt_logprobs and 1 <= last_n <= len(prompt) - 1):
            raise ApiError(400, f"asample: prompt_logprobs_last_n={last_n} needs prompt_logprobs and must lie in "
                                f"[1, {len(prompt) - 1}] (the prompt's length - 1)")
        rid = self.futures.open("sample")  # after the checks: a refused request leaves no future nobody finishes
        try:
            batcher.put(SampleJob(rid, prompt, sampling, bool(req.prompt_logprobs), version, last_n))
        except UserError as e:
            self.futures.finish(rid, Result(error=str(e), category="user"))
        # one id per requested sample, in the response's order (the SDK stamps them on the sequences)
        return {"request_id": rid, "sample_sequence_ids": [f"{rid}-{k}" for k in range(sampling.n)]}

    def _sampling_config(self, req: Any, prompt_len: int) -> SamplingConfig:
        p = req.sampling_params
        room = self.opts.max_context - prompt_len
        if prompt_len == 0 or room < 1:
            raise ApiError(400, f"asample: the prompt has {prompt_len} tokens; it must have 1 to "
                                f"{self.opts.max_context - 1} (the server's --max-context is {self.opts.max_context})")
        max_tokens = room if p.max_tokens is None else int(p.max_tokens)
        if not 1 <= max_tokens <= room:
            raise ApiError(400, f"asample: max_tokens={max_tokens} with a {prompt_len}-token prompt does not fit the "
                                f"server's --max-context {self.opts.max_context} (at most {room})")
        if req.num_samples < 1:
            raise ApiError(400, f"asample: num_samples={req.num_samples} (at least 1)")
        stop = p.stop
        strings: tuple[str, ...] = ()
        ids: tuple[int, ...] = ()
        if isinstance(stop, str):
            strings = (stop,)
        elif stop is not None:
            stop = list(stop)
            if all(isinstance(s, int) for s in stop):
                ids = tuple(int(s) for s in stop)
            elif all(isinstance(s, str) for s in stop):
                strings = tuple(stop)
            else:
                raise ApiError(400, "asample: sampling_params.stop mixes strings and token ids (give one kind)")
        return SamplingConfig(n=int(req.num_samples), max_new_tokens=max_tokens, temperature=float(p.temperature),
                              top_p=float(p.top_p), top_k=int(p.top_k), seed=p.seed, stop_token_ids=ids,
                              stop=strings, ignore_eos=stop == [])  # fmt: skip

    # -- futures ---------------------------------------------------------------------------------------------------
    async def retrieve(self, body: dict) -> Result | dict:
        """The result of a request: a :class:`Result` when it is done, a "try again" answer while it runs."""
        rid = str(body.get("request_id", ""))
        try:
            res = await self.futures.wait(rid, self.opts.poll_s)
        except KeyError:
            raise ApiError(404, f"retrieve_future: unknown request_id {rid!r} (never made here, or its result "
                                f"expired {self.futures.ttl_s:.0f}s after it finished)") from None
        if res is None:
            return {"type": "try_again", "request_id": rid, "queue_state": "active"}
        return res

    def close(self) -> None:
        """Unload every model (their roles stop), wait for the unloads already under way (a finished session's, the
        reaper's; within ``op_timeout_s`` in all), and stop Ray if the server started it."""
        self._stop.set()
        if self.models:
            log.info("rlvr serve: stopping; unloading %d model(s)", len(self.models))
        for model_id in list(self.models):
            self.unload(model_id)
        deadline = time.monotonic() + self.opts.op_timeout_s
        with self.lock:
            pending = list(self._unloaders)
        for t in pending:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                log.warning("rlvr serve: %s still running after %.0fs (--op-timeout-s); exiting anyway", t.name,
                            self.opts.op_timeout_s)
        self.futures.close()
        if self.keeper is not None:
            self.keeper.shutdown()


def lora_targets(cfg: Any) -> tuple[str, ...]:
    """The adapters' target modules for Tinker's ``LoraConfig`` (``train_attn``, ``train_mlp``; Llama-family
    module names). ``train_unembed`` is not applied: rlvr's LoRA adapts linear layers inside the blocks (and the
    embedded model ties its output layer to its input embeddings). Errors: :class:`ApiError` 400 when neither is
    trained."""
    from rlvr.config_sections import LORA_ATTENTION, LORA_MLP

    targets = (LORA_ATTENTION if cfg.train_attn else ()) + (LORA_MLP if cfg.train_mlp else ())
    if not targets:
        raise ApiError(400, "create_model: lora_config trains neither attention nor MLP layers (train_attn and "
                            "train_mlp are both false): nothing to train")
    return targets


def model_name_of(model_dir: str, asked: str) -> str:
    """The name clients use for the model: an embedded model's hub id (``HuggingFaceTB/SmolLM2-135M-Instruct``),
    a folder's ``config.json`` ``_name_or_path`` when it is a hub id, else what was asked."""
    from rlvr.models.embedded import UPSTREAM_NAMES

    if asked in UPSTREAM_NAMES:
        return UPSTREAM_NAMES[asked]
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        name = str(cfg.get("_name_or_path") or "")
    except (OSError, ValueError):
        name = ""
    return name if name and not name.startswith("/") else asked
