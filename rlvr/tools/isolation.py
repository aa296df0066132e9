"""Where typed tools run: the isolation of every tool call (the model chooses a tool's arguments, so every typed tool
is a model-driven path).

Processes, per worker of the :class:`~rlvr.tools.execute.ToolPool` and per distinct :class:`~rlvr.tools.registry.
Access` of the recipe's tools::

    trainer --ProcessPool--> worker (runs no tool code) --pipes, JSON--> server --fork per call--> call process

- The **server** is a fresh interpreter (``python -I``) started with a scrubbed environment (``PATH``, ``LANG``,
  ``LC_ALL``, ``TZ`` and the tool's own :func:`~rlvr.tools.registry.access` ``env`` names: no secret of the
  trainer's is in its memory or its ``/proc/self/environ``), inside new namespaces where the machine allows. It
  imports the tools once (with the trainer's view of the file system), then hardens its view (below) and serves.
- Each job (a call, a stateful tool's ``create`` or ``close``: :mod:`rlvr.tools.calls`) runs in a **call process**
  forked from the server: its own process group; an empty folder of its own as working directory, ``HOME`` and
  ``TMPDIR`` (removed after the call); stdin/stdout/stderr on ``/dev/null`` (what it prints through Python is
  captured); no other file descriptor but its result pipe; every capability dropped (bounding set too; no new
  privileges); ``RLIMIT_NPROC`` (:data:`NPROC_BUDGET` more processes and threads than its user had when the
  server started) and ``RLIMIT_AS`` (``memory_mb``); the socket audit hook (:func:`rlvr.tools.calls.no_network`)
  unless the tool opened the network.
- At the end of every job (its result sent, its time limit passed, or its process dead) the server kills the
  call's **whole process tree** and reaps it; when its worker goes away (the pool closes, the trainer dies, the
  pool kills the worker) the server sees its job pipe close, kills the tree and exits.
- The worker relays jobs and results as JSON (results are never unpickled outside the call process).

Modes, the first that works on this machine (:func:`machine_isolation`, probed once per process and logged by the
pool with what holds, :meth:`Isolation.holds`):

1. ``ns-root`` (running as root, ``unshare`` usable): the server runs in new mount, PID, IPC and network
   namespaces (``unshare --mount --pid --fork --kill-child --mount-proc --ipc --net``) and is the first process
   of its PID namespace; calls run as user ``nobody``.
2. ``ns-user`` (not root, unprivileged user namespaces allowed): the same with ``--map-root-user``; calls run as
   the trainer's user (root of the user namespace, every capability dropped).
3. ``plain-nobody`` (root, no namespaces): calls run as ``nobody``; the server (root) is a subreaper
   (``PR_SET_CHILD_SUBREAPER``), so what a call forks stays its descendant however it detaches.
4. ``plain``: as 3 with the trainer's user.

Files in the ``ns-*`` modes: in its mount namespace the server covers ``/tmp``, ``/var/tmp``, ``/dev/shm``,
``/run/lock``, ``/root`` and ``/home`` with empty tmpfs, binds back (read-only) what the tools need to run
(:func:`import_paths`: the interpreter's prefixes, every ``sys.path`` entry, a tool's package folder or, for a tool
in a module of its own such as ``my_tools.py``, that one file and not the folder around it) and the tool's ``read``
folders, binds back read-write the calls' folders and the tool's ``write`` folders, and remounts every other mount
read-only: a write anywhere else fails with ``EROFS``. The start-up line names what is shown inside the hidden
folders. Since a mount namespace made by root cannot be changed by a process without capabilities, a call cannot
undo this.

Without a PID namespace (modes 3, 4) a call's processes are found through the subreaper; in mode 4 a call runs as
the same user as its server and could signal it, so a hostile tool can escape there: mode 4 contains nothing but
by convention, and the pool logs it as a warning.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import secrets
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from rlvr.tools.registry import Access

MODES = ("ns-root", "ns-user", "plain-nobody", "plain")
COVERED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/root", "/home")
"""Folders hidden under empty tmpfs in the ``ns-*`` modes (homes, and the world-writable ones)."""
ENV_KEPT = ("PATH", "LANG", "LC_ALL", "TZ")
"""The trainer's environment variables a tool sees (besides its own ``access(env=...)``); ``HOME`` and ``TMPDIR``
are its call's folder."""
NPROC_BUDGET = 256
"""Processes and threads a call may add to those its user had when its server started (``RLIMIT_NPROC``; not
enforced for a root caller in ``plain`` mode)."""
REAP_S = 5.0
"""Seconds the server spends killing and reaping a call's processes before it gives up (kills are immediate; a
fork bomb bounded by ``RLIMIT_NPROC`` dies in milliseconds)."""
MAX_RESULT_BYTES = 64 << 20
"""The largest result (JSON: text and state) a call may send; past it the call is an error."""
SCRATCH_MB = 1024
"""Size of the tmpfs holding the calls' folders in the ``ns-*`` modes (MiB; memory is used only as files are
written; a call writing past it gets ``ENOSPC``)."""
SERVER_START_S = 100.0
"""Seconds a server may take to start (interpreter, imports of the tools, mounts)."""
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

_HOLDS = {
    "ns-root": {
        "files": "read-only everywhere but the call's own folder (its HOME and TMPDIR, emptied after the call); "
                 "/home, /root, /tmp, /var/tmp, /dev/shm and /run/lock hidden",
        "reads": "as user nobody: world-readable files outside the hidden folders",
        "processes": "a PID namespace per server: every process a call starts is killed when the call ends, at its "
                     "time limit, and when the pool closes or the trainer dies",
        "network": "none: a network namespace of its own (and a socket audit hook)",
    },
    "ns-user": {
        "files": "read-only everywhere but the call's own folder (its HOME and TMPDIR, emptied after the call); "
                 "/home, /root, /tmp, /var/tmp, /dev/shm and /run/lock hidden",
        "reads": "as the trainer's user (root of a user namespace, no capability): what that user may read outside "
                 "the hidden folders",
        "processes": "a PID namespace per server: every process a call starts is killed when the call ends, at its "
                     "time limit, and when the pool closes or the trainer dies",
        "network": "none: a network namespace of its own (and a socket audit hook)",
    },
    "plain-nobody": {
        "files": "NOT confined to the call's folder: as user nobody it may write wherever nobody may, "
                 "world-writable folders (/tmp, /var/tmp, /dev/shm) included",
        "reads": "as user nobody: world-readable files",
        "processes": "the server (root, a subreaper) kills every process a call starts when the call ends, at its "
                     "time limit, and when the pool closes or the trainer dies",
        "network": "a socket audit hook only (C code calling libc directly gets past it)",
    },
    "plain": {
        "files": "NOT confined: whatever the trainer's user may write",
        "reads": "whatever the trainer's user may read: for a non-root user its other processes' "
                 "/proc/<pid>/environ included (root, without capabilities: files by their owner and mode, not "
                 "other processes' environment)",
        "processes": "the server (a subreaper) kills every process a call starts when the call ends, at its time "
                     "limit and at pool close; a call runs as the same user as its server and could signal it, so a "
                     "hostile tool can escape",
        "network": "a socket audit hook only (C code calling libc directly gets past it)",
    },
}


@dataclass(frozen=True)
class Isolation:
    """An isolation mode (module docstring): ``mode`` one of :data:`MODES`; ``why``: why the better modes were
    not taken (empty when this is the best one for the caller's user)."""

    mode: str
    why: str = ""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown tool isolation mode {self.mode!r}; the modes: {', '.join(MODES)}")

    @property
    def namespaces(self) -> bool:
        return self.mode in ("ns-root", "ns-user")

    @property
    def drops(self) -> bool:
        """Calls run as ``nobody`` (the server runs as root)."""
        return self.mode in ("ns-root", "plain-nobody")

    def command(self, access: Access) -> list[str]:
        """The ``unshare`` prefix a server of a tool with ``access`` starts under (empty in the plain modes)."""
        if not self.namespaces:
            return []
        user = ["--map-root-user"] if self.mode == "ns-user" else []
        net = [] if access.network else ["--net"]
        return ["unshare", *user, "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", *net]

    def holds(self, access: Access = Access(), shown: dict[str, str] | None = None) -> dict[str, str]:
        """What holds for a tool with ``access`` in this mode: ``files``, ``reads``, ``environment``,
        ``processes``, ``network`` (one sentence each). ``shown``: the paths bound back read-only for the tools'
        imports (:func:`import_paths`, path -> why); in the ``ns-*`` modes ``files`` names those inside the hidden
        folders."""
        out = dict(_HOLDS[self.mode])
        inside = {p: why for p, why in (shown or {}).items() if any(under(p, c) for c in COVERED_DIRS)}
        inside = {p: why for p, why in inside.items() if not any(q != p and under(p, q) for q in inside)}
        if self.namespaces and inside:
            out["files"] += "; shown in them, read-only, for the tools' imports: " + ", ".join(
                f"{p} ({why})" for p, why in inside.items())
        out["environment"] = ("PATH, LANG, LC_ALL, TZ, HOME and TMPDIR (the call's folder) only; the server starts "
                              "with nothing else") + (f"; also {', '.join(access.env)}" if access.env else "")
        out["processes"] += f"; at most {NPROC_BUDGET} more processes and threads (RLIMIT_NPROC)" + (
            " - not enforced for root" if self.mode == "plain" and os.geteuid() == 0 else "")
        if access.network:
            out["network"] = "the host's network (access(network=True))"
        if access.write:
            out["files"] += f"; also writes {', '.join(access.write)} (access(write=...))"
        if access.read:
            out["reads"] += f"; also {', '.join(access.read)} (access(read=...))"
        return out

    def describe(self, access: Access = Access(), shown: dict[str, str] | None = None) -> str:
        """One line: the mode, then what holds (:meth:`holds`)."""
        h = self.holds(access, shown)
        return f"{self.mode} - " + "; ".join(f"{k}: {h[k]}" for k in ("files", "reads", "environment", "network",
                                                                          "processes"))  # fmt: skip


def under(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or lies inside it (by name; both absolute)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def import_paths(objs: dict[str, Any], sys_path: list[str] | None = None) -> dict[str, str]:
    """What the tools ``objs`` (target -> function or class) need to run once imported, to bind back read-only in
    the ``ns-*`` modes, as path -> why (``the interpreter``, ``sys.path``, ``a tool's package``, ``a tool's file``):
    the interpreter's prefixes and folder; every entry of ``sys_path`` (default this process's ``sys.path``, ``''``
    read as the working folder; for imports made inside a call); for a tool in a package, the top-level package's
    folders; for a tool in a module of its own (a ``file.py:name`` tool, a top-level module) that one file, never
    the folder around it, which often holds a user's other files (the module is imported before the view narrows;
    its file stays readable for tracebacks and ``inspect``). Only existing paths, in this order."""
    out: dict[str, str] = {}
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))):
        out.setdefault(p, "the interpreter")
    for p in sys.path if sys_path is None else sys_path:
        out.setdefault(p or os.getcwd(), "sys.path")
    for obj in objs.values():
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        if module is None:
            continue
        top = sys.modules.get(module.__name__.partition(".")[0])
        if "." in module.__name__ and top is not None and getattr(top, "__path__", None) is not None:
            for p in top.__path__:
                out.setdefault(os.path.abspath(p), "a tool's package")
        elif getattr(module, "__file__", None):
            out.setdefault(os.path.abspath(module.__file__), "a tool's file")
    return {p: why for p, why in out.items() if os.path.exists(p)}


def nobody() -> tuple[int, int]:
    """(uid, gid) of ``nobody`` (65534 where the user database has none)."""
    try:
        pw = pwd.getpwnam("nobody")
        return pw.pw_uid, pw.pw_gid
    except KeyError:
        return 65534, 65534


def tasks_of(uid: int) -> int:
    """Processes and threads whose real user id is ``uid`` (what ``RLIMIT_NPROC`` counts), from ``/proc``."""
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                n += int(fields.get("Threads", "1").strip() or 1)
        except (OSError, KeyError, ValueError):
            continue
    return n


# -- framing: an 8-byte little-endian length, then that many bytes of JSON -------------------------------------------
def send_msg(fd: int, obj: Any) -> None:
    """Send ``obj`` as one framed JSON message."""
    data = json.dumps(obj).encode()
    view = memoryview(struct.pack("<Q", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the pipe")
        buf += chunk
    return bytes(buf)


def recv_msg(fd: int, limit: int = MAX_RESULT_BYTES + (1 << 20)) -> Any:
    """One framed JSON message. Errors: ``EOFError`` when the pipe closes, ``ValueError`` past ``limit`` bytes."""
    (n,) = struct.unpack("<Q", _read_exactly(fd, 8))
    if n > limit:
        raise ValueError(f"a message of {n} bytes (over {limit})")
    return json.loads(_read_exactly(fd, n))


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


# -- the worker's side ------------------------------------------------------------------------------------------------
# The first code a server runs: read its settings, take the trainer's sys.path, serve.
BOOT = r"""
import json, os, struct, sys
j, r = int(sys.argv[1]), int(sys.argv[2])
def rd(n):
    b = b""
    while len(b) < n:
        c = os.read(j, n - len(b))
        if not c:
            raise SystemExit(0)
        b += c
    return b
init = json.loads(rd(struct.unpack("<Q", rd(8))[0]))
sys.path[:] = init["sys_path"]
from rlvr.tools.jail import serve
serve(j, r, init)
"""


class Server:
    """A running server (module docstring) for the tools ``targets``, all with ``access``, in mode ``iso``;
    ``settings``: ``call_timeout_s`` (a job's limit, seconds), ``max_output_chars``, ``memory_mb`` (None: no
    limit); ``env_values``: the trainer's values of ``access.env`` (a missing one is left unset).

    Errors: ``RuntimeError`` when the server does not start (it holds the server's traceback or ``unshare``'s
    message)."""

    def __init__(self, iso: Isolation, access: Access, targets: tuple[str, ...], settings: dict[str, Any],
                 env_values: dict[str, str | None] | None = None) -> None:
        self.iso = iso
        if iso.namespaces:  # made by the server inside its own view (under the /tmp cover): never on the host
            self.work = f"/tmp/rlvr-tool-{secrets.token_hex(8)}"
        else:
            self.work = tempfile.mkdtemp(prefix="rlvr-tool-")
            os.chmod(self.work, 0o711)
        env = {k: os.environ[k] for k in ENV_KEPT if k in os.environ}
        env.setdefault("PATH", _DEFAULT_PATH)
        env.setdefault("LANG", "C.UTF-8")
        env.update({k: v for k, v in (env_values or {}).items() if v is not None})
        env["HOME"] = env["TMPDIR"] = self.work
        job_r, self._job_w = os.pipe()
        self._res_r, res_w = os.pipe()
        self._err = tempfile.TemporaryFile()
        call_uid = nobody()[0] if iso.drops else os.getuid()
        init = {"sys_path": [p or os.getcwd() for p in sys.path], "targets": list(targets), "mode": iso.mode,
                "access": {"network": access.network, "write": list(access.write), "read": list(access.read)},
                "work": self.work, "env": env, "nproc": tasks_of(call_uid) + NPROC_BUDGET, "nobody": nobody(),
                "call_timeout_s": float(settings["call_timeout_s"]), "max_output_chars": int(settings[
                    "max_output_chars"]), "memory_mb": settings.get("memory_mb")}  # fmt: skip
        try:
            self.proc = subprocess.Popen([*iso.command(access), sys.executable, "-I", "-c", BOOT, str(job_r),
                                          str(res_w)], env=env, pass_fds=(job_r, res_w), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=self._err, start_new_session=True)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(job_r)
            os.close(res_w)
        try:
            send_msg(self._job_w, init)
            ready = self._wait_ready()
        except BaseException:
            self.close()
            raise
        if not ready.get("ready"):
            self.close()
            raise RuntimeError(f"a tool server ({iso.mode}) could not start:\n{ready.get('error', '')}")

    def _wait_ready(self) -> dict[str, Any]:
        end = time.monotonic() + SERVER_START_S
        while time.monotonic() < end:
            if select.select([self._res_r], [], [], 0.2)[0]:
                try:
                    return recv_msg(self._res_r)
                except EOFError:
                    break
            if self.proc.poll() is not None and not select.select([self._res_r], [], [], 0)[0]:
                break
        self._err.seek(0)
        err = self._err.read().decode("utf-8", "replace")[-4000:]
        alive = self.proc.poll() is None
        return {"ready": False, "error": err or (f"no answer within {SERVER_START_S:.0f} s" if alive else
                                                 f"it exited with code {self.proc.returncode}")}

    def call(self, job: tuple) -> dict[str, Any]:
        """Run ``job`` (:mod:`rlvr.tools.calls`; plus ``("probe",)``): a dict with ``status`` (``ok``, ``error``,
        ``timeout``, ``crashed``), ``text``, ``cut``, ``state`` (bytes or None). Errors: ``EOFError``/``OSError``
        when the server died."""
        op, rest = job[0], list(job[1:])
        if op == "call":
            rest[3] = b64(rest[3])
        elif op == "close":
            rest[1] = b64(rest[1])
        send_msg(self._job_w, [op, *rest])
        out = recv_msg(self._res_r)
        out["state"] = unb64(out.get("state"))
        return out

    def close(self) -> None:
        """Close the job pipe (the server kills what runs and exits), wait up to 2 s, then kill it. Idempotent."""
        for fd in (self._job_w, self._res_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._job_w = self._res_r = -1
        proc = getattr(self, "proc", None)
        if proc is not None:
            try:
                proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=REAP_S)
        if not self.iso.namespaces:
            shutil.rmtree(self.work, ignore_errors=True)
        self._err.close()


_MACHINE: Isolation | None = None
_MACHINE_LOCK = threading.Lock()


def candidates() -> list[str]:
    """The modes worth trying for this process's user, best first."""
    root = os.geteuid() == 0
    out = []
    if shutil.which("unshare"):
        out.append("ns-root" if root else "ns-user")
    return out + (["plain-nobody", "plain"] if root else ["plain"])


def probe(mode: str) -> str | None:
    """None when a server in ``mode`` starts and a call in it behaves as the mode promises (its folder writable;
    in the ``ns-*`` modes ``/`` read-only; as ``nobody``, every ``sys.path`` entry readable); else why not."""
    try:
        server = Server(Isolation(mode), Access(), (), {"call_timeout_s": 30.0, "max_output_chars": 0,
                                                       "memory_mb": None})  # fmt: skip
    except (RuntimeError, OSError) as e:
        return str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    try:
        out = server.call(("probe",))
    except (EOFError, OSError, ValueError) as e:
        return f"the probe call failed ({type(e).__name__})"
    finally:
        server.close()
    if out["status"] != "ok":
        return f"the probe call ended {out['status']}: {out['text'][:300]}"
    facts = json.loads(out["text"])
    if not facts["folder_writable"]:
        return "a call cannot write its own folder"
    if Isolation(mode).namespaces and facts["root_writable"]:
        return "/ stayed writable"
    if facts["unreadable"]:
        return f"a call cannot read {facts['unreadable'][0]} (sys.path)"
    return None


def machine_isolation(refresh: bool = False) -> Isolation:
    """The best mode that works here (module docstring), probed once per process (about 0.3 s a mode) and
    cached; ``refresh`` probes again. Its ``why`` says why better modes failed."""
    global _MACHINE
    with _MACHINE_LOCK:
        if _MACHINE is not None and not refresh:
            return _MACHINE
        why = []
        modes = candidates()
        for mode in modes:
            reason = probe(mode) if mode != modes[-1] else None  # the last one is the floor: nothing to fall to
            if reason is None:
                _MACHINE = Isolation(mode, "; ".join(why))
                break
            why.append(f"{mode}: {reason}")
        assert _MACHINE is not None
        return _MACHINE
