"""Metrics: pass@k, sinks (JSON lines) and console progress."""

from rlvr.metrics.passk import group_pass_at_k, pass_at_k
from rlvr.metrics.progress import Progress
from rlvr.metrics.sinks import JsonlSink

__all__ = ["JsonlSink", "Progress", "group_pass_at_k", "pass_at_k"]
