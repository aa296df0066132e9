"""Metric backends (TensorBoard, W&B offline, MLflow file store) read back with each tool's own reader; the
JSONL sample table; MultiSink switching off a failing backend; make_sinks from a recipe."""

from __future__ import annotations

import glob
import json
import logging
import struct
import sys
from pathlib import Path

import pytest
import torch

from rlvr.recipe import load_recipe
from rlvr.metrics.sinks import (
    JsonlSink,
    MLflowSink,
    MultiSink,
    TensorBoardSink,
    WandbSink,
    make_sinks,
    markdown_table,
    mlflow_name,
)

ROWS = [
    {"prompt_index": 3, "prompt": "What is 2+2?", "response": "so a | b\nthe answer is 4", "parsed": "4",
     "reward": 1.0, "reason": None},
    {"prompt_index": 5, "prompt": "What is 3*3?", "response": "8", "parsed": "8", "reward": 0.0, "reason": "wrong"},
]


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """W&B with no account and a dead server address: offline mode must never need either."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    for var, sub in (("WANDB_CONFIG_DIR", "cfg"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / sub))


def _wandb_records(path):
    """Protobuf records of a ``run-<id>.wandb`` file: a 7-byte header (``:W&B``, magic, version), then LevelDB
    log records (32 KiB blocks; each record: crc32 (4), length (2, little-endian), type (1: full, 2: first,
    3: middle, 4: last))."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, block = 7, b"", 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and n == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + n], pos + 7 + n
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec


def _wandb_history(path) -> dict[int, dict[str, str]]:
    out = {}
    for rec in _wandb_records(path):
        if rec.WhichOneof("record_type") == "history":
            out[rec.history.step.num] = {i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item}
    return out


def test_jsonl_sample_table(tmp_path):
    with JsonlSink(tmp_path / "metrics.jsonl") as sink:
        sink.log_table(4, ROWS)
        sink.log_table(8, [{"reward": float("nan"), "ok": True}])
        with pytest.raises(ValueError):
            sink.log_table(9, [{"step": 1}])
    lines = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert lines == [{"step": 4, **ROWS[0]}, {"step": 4, **ROWS[1]}, {"step": 8, "reward": None, "ok": True}]
    assert (tmp_path / "metrics.jsonl").read_text() == ""  # tables do not touch the metrics file


def test_markdown_table_escapes_and_formats():
    # "x|y\nz" is cut to 3 characters, then "|" escaped; a new line inside a shorter cell becomes <br>
    text = markdown_table([{"a": "x|y\nz", "b": 0.123456}, {"a": "p\nq", "c": 2}], max_chars=3)
    assert text == "| a | b | c |\n|---|---|---|\n| x\\|y ... | 0.1235 |  |\n| p<br>q |  | 2 |"


def test_mlflow_names():
    assert mlflow_name("val/pass@8") == "val/pass_at_8"
    assert mlflow_name("reward/score/math#2") == "reward/score/math_2"
    assert mlflow_name("timing/rollout_s") == "timing/rollout_s"


def test_tensorboard_events_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    sink.log(1, {"reward/mean": torch.tensor(0.25), "val/pass@4": 0.5, "sync/gbps": float("nan")})
    sink.log(2, {"reward/mean": 0.75, "sync/gbps": 1.5})
    sink.log_table(2, ROWS)
    sink.close()
    sink.close()  # idempotent
    ea = EventAccumulator(str(tmp_path / "tb"))
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("reward/mean")] == [(1, 0.25), (2, 0.75)]
    assert [(e.step, e.value) for e in ea.Scalars("val/pass@4")] == [(1, 0.5)]
    assert [(e.step, e.value) for e in ea.Scalars("sync/gbps")] == [(2, 1.5)]  # NaN skipped
    (text,) = ea.Tensors("samples/text_summary")
    assert text.step == 2
    md = text.tensor_proto.string_val[0].decode()
    assert md.splitlines()[0] == "| prompt_index | prompt | response | parsed | reward | reason |"
    assert "| 3 | What is 2+2? | so a \\| b<br>the answer is 4 | 4 | 1 |  |" in md
    assert "| 5 | What is 3*3? | 8 | 8 | 0 | wrong |" in md


def test_wandb_offline_files_and_history(tmp_path, wandb_env):
    pytest.importorskip("wandb")
    sink = WandbSink(tmp_path / "run", "rlvr-test", "r1", mode="offline", config={"trainer": {"lr": 1e-6}})
    sink.log(1, {"reward/mean": 0.25, "val/pass@4": 0.5, "sync/gbps": float("inf")})
    sink.log_table(2, ROWS)
    sink.log(2, {"reward/mean": 0.75})
    sink.close()
    sink.close()
    (run_dir,) = glob.glob(str(tmp_path / "run" / "wandb" / "offline-run-*"))
    (wandb_file,) = glob.glob(f"{run_dir}/run-*.wandb")
    hist = _wandb_history(wandb_file)
    assert sorted(hist) == [1, 2]
    assert json.loads(hist[1]["reward/mean"]) == 0.25 and json.loads(hist[1]["val/pass@4"]) == 0.5
    assert "sync/gbps" not in hist[1]  # inf skipped
    assert json.loads(hist[2]["reward/mean"]) == 0.75 and json.loads(hist[2]["samples/nrows"]) == 2
    (run,) = [r.run for r in _wandb_records(wandb_file) if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name, run.telemetry.feature.offline) == ("rlvr-test", "r1", True)
    assert {i.key: json.loads(i.value_json) for i in run.config.update}["trainer"] == {"lr": 1e-6}
    (table_file,) = glob.glob(f"{run_dir}/files/media/table/samples_*.table.json")
    table = json.loads(Path(table_file).read_text())
    assert table["columns"] == ["prompt_index", "prompt", "response", "parsed", "reward", "reason"]
    assert table["data"] == [[3, "What is 2+2?", "so a | b\nthe answer is 4", "4", 1.0, None],
                             [5, "What is 3*3?", "8", "8", 0.0, "wrong"]]


def test_mlflow_file_store_read_back(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    sink = MLflowSink(str(store), "exp-a", "run-1", {"trainer": {"lr": 1e-6, "betas": [0.9, 0.99]}, "run": {"seed": 3}})
    sink.log(1, {"reward/mean": 0.25, "val/pass@4": torch.tensor(0.5), "sync/gbps": float("nan")})
    sink.log(2, {"reward/mean": 0.75})
    sink.log_table(2, ROWS)
    sink.close()
    client = MlflowClient(tracking_uri=store.as_uri())
    run = client.get_run(sink.run_id)
    assert run.info.run_name == "run-1" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "exp-a"
    assert run.data.params == {"trainer.lr": "1e-06", "trainer.betas": "[0.9, 0.99]", "run.seed": "3"}
    assert [(m.step, m.value) for m in client.get_metric_history(sink.run_id, "reward/mean")] == [(1, 0.25), (2, 0.75)]
    assert [(m.step, m.value) for m in client.get_metric_history(sink.run_id, "val/pass_at_4")] == [(1, 0.5)]
    assert client.get_metric_history(sink.run_id, "sync/gbps") == []
    local = client.download_artifacts(sink.run_id, "samples/step_000002.json", str(tmp_path / "dl"))
    table = json.loads(Path(local).read_text())
    assert table["columns"] == ["prompt_index", "prompt", "response", "parsed", "reward", "reason"]
    assert table["data"][1] == [5, "What is 3*3?", "8", "8", 0.0, "wrong"]


class _Recorder:
    """A backend that records its calls and raises from the ``fail_at``-th call of ``fail_in`` on."""

    def __init__(self, fail_in: str | None = None, fail_at: int = 1):
        self.calls: list[tuple] = []
        self.fail_in, self.fail_at, self.closed = fail_in, fail_at, 0

    def _call(self, name, *args):
        self.calls.append((name, *args))
        if name == self.fail_in and sum(c[0] == name for c in self.calls) >= self.fail_at:
            raise RuntimeError(f"boom in {name}")

    def log(self, step, metrics):
        self._call("log", step)

    def log_table(self, step, rows):
        self._call("log_table", step)

    def close(self):
        self.closed += 1


def test_failing_backend_warns_once_and_jsonl_keeps_every_row(tmp_path, caplog):
    bad, good, bad_table = _Recorder("log", fail_at=2), _Recorder(), _Recorder("log_table")
    sink = MultiSink(JsonlSink(tmp_path / "metrics.jsonl"), {"bad": bad, "good": good, "bad_table": bad_table})
    with caplog.at_level(logging.WARNING, logger="rlvr.metrics.sinks"):
        for step in range(1, 5):
            sink.log(step, {"reward/mean": step / 10})
            sink.log_table(step, ROWS[:1])
        sink.close()
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        {"step": s, "reward/mean": s / 10} for s in range(1, 5)
    ]
    assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == 4
    assert bad.calls == [("log", 1), ("log_table", 1), ("log", 2)]  # nothing after the failure
    assert bad_table.calls == [("log", 1), ("log_table", 1)]
    assert len(good.calls) == 8 and good.closed == 1
    assert bad.closed == 1 and bad_table.closed == 1  # closed once, when switched off
    assert sink.active == ["good"] and set(sink.disabled) == {"bad", "bad_table"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # bad_table fails at step 1 (log_table), bad at step 2 (log)
    assert "'bad_table' failed in log_table" in warnings[0] and "boom in log_table" in warnings[0]
    assert "'bad' failed in log " in warnings[1] and "boom in log)" in warnings[1]


def test_real_backend_failure_is_contained(tmp_path, caplog):
    """An MLflow run deleted under the sink: MLflow refuses further metrics; the run goes on."""
    pytest.importorskip("mlflow")
    mlf = MLflowSink(str(tmp_path / "mlruns"), "e", "r")
    sink = MultiSink(JsonlSink(tmp_path / "metrics.jsonl"), {"mlflow": mlf})
    sink.log(1, {"a": 1.0})
    mlf.client.delete_run(mlf.run_id)
    with caplog.at_level(logging.WARNING, logger="rlvr.metrics.sinks"):
        sink.log(2, {"a": 2.0})
        sink.log(3, {"a": 3.0})
        sink.close()
    assert sink.active == [] and "mlflow" in sink.disabled
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1
    assert [json.loads(x)["a"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1.0, 2.0, 3.0]


def test_make_sinks_all_backends(tmp_path, wandb_env):
    for mod in ("tensorboard", "wandb", "mlflow"):
        pytest.importorskip(mod)
    recipe = load_recipe(None, ["metrics.backends=[tensorboard,wandb,mlflow]", "run.name=exp1"])
    run = tmp_path / "exp1-2"
    with make_sinks(recipe, run) as sink:
        assert list(sink.backends) == ["tensorboard", "wandb", "mlflow"]
        sink.log(1, {"reward/mean": 0.5})
        sink.log_table(1, ROWS)
    assert sink.active == ["tensorboard", "wandb", "mlflow"]
    assert json.loads((run / "metrics.jsonl").read_text()) == {"step": 1, "reward/mean": 0.5}
    assert len((run / "samples.jsonl").read_text().splitlines()) == 2
    assert glob.glob(str(run / "tensorboard" / "events.out.tfevents.*"))
    (wandb_file,) = glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert json.loads(_wandb_history(wandb_file)[1]["reward/mean"]) == 0.5
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run / "mlruns").as_uri())
    (r,) = client.search_runs([client.get_experiment_by_name("exp1").experiment_id])
    assert r.info.run_name == "exp1-2" and r.data.metrics == {"reward/mean": 0.5}
    assert r.data.params["metrics.backends"] == "['tensorboard', 'wandb', 'mlflow']"


def test_make_sinks_jsonl_only(tmp_path):
    recipe = load_recipe(None, [])
    with make_sinks(recipe, tmp_path) as sink:
        sink.log(3, {"x": 1})
    assert sink.backends == {}
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 3, "x": 1.0}


@pytest.mark.parametrize(
    "modules, make, package",
    [
        (["torch.utils.tensorboard"], lambda d: TensorBoardSink(d), "tensorboard"),
        (["wandb"], lambda d: WandbSink(d, "p", "n"), "wandb"),
        (["mlflow", "mlflow.entities", "mlflow.tracking"], lambda d: MLflowSink(d / "mlruns", "e", "r"), "mlflow-skinny"),
    ],
)
def test_missing_package_names_the_pip_install(tmp_path, monkeypatch, modules, make, package):
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # "import module" now raises ImportError
    with pytest.raises(ImportError, match=rf"pip install 'rlvr\[logging\]' \(or pip install {package}\)"):
        make(tmp_path)
