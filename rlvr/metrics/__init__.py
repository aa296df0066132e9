"""Metrics: their names (:mod:`rlvr.metrics.names`: the catalogue, units), pass@k, sinks (JSON lines,
TensorBoard, W&B, MLflow), sample tables and console progress."""

from rlvr.metrics.passk import group_pass_at_k, pass_at_k
from rlvr.metrics.progress import Progress
from rlvr.metrics.samples import print_sample_table, sample_rows
from rlvr.metrics.sinks import JsonlSink, MultiSink, make_sinks

__all__ = ["JsonlSink", "MultiSink", "Progress", "group_pass_at_k", "make_sinks", "pass_at_k", "print_sample_table", "sample_rows"]
