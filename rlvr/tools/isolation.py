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
``/run/lock``, ``/root`` and ``/home`` with empty tmpfs, binds back (read-only) what the tools need to run (the
interpreter's prefixes, every ``sys.path`` entry, the tools' own folders, the tool's ``read`` folders), binds back
read-write the calls' folders and the tool's ``write`` folders, and remounts every other mount read-only: a write
anywhere else fails with ``EROFS``. Since a mount namespace made by root cannot be changed by a process without
capabilities, a call cannot undo this.

Without a PID namespace (modes 3, 4) a call's processes are found through the subreaper; in mode 4 a call runs as
the same user as its server and could signal it, so a hostile tool can escape there: mode 4 contains nothing but
by convention, and the pool logs it as a warning.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import json
import os
import pwd
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
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

_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_SECUREBITS = 1, 4, 24, 28
_PR_SET_NO_NEW_PRIVS, _PR_SET_CHILD_SUBREAPER, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 38, 36, 47, 4
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 2, 4, 8, 32, 4096, 16384
_MS_PRIVATE, _MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME, _MS_STRICTATIME = 1 << 18, 1024, 2048, 1 << 21, 1 << 24
_LOCKED_FLAGS = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "noatime": _MS_NOATIME,
                 "nodiratime": _MS_NODIRATIME, "relatime": _MS_RELATIME}  # fmt: skip

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
        "reads": "whatever the trainer's user may read, other processes' /proc/<pid>/environ included",
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

    def holds(self, access: Access = Access()) -> dict[str, str]:
        """What holds for a tool with ``access`` in this mode: ``files``, ``reads``, ``environment``,
        ``processes``, ``network`` (one sentence each)."""
        out = dict(_HOLDS[self.mode])
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

    def describe(self, access: Access = Access()) -> str:
        """One line: the mode, then what holds."""
        h = self.holds(access)
        return f"{self.mode} - " + "; ".join(f"{k}: {h[k]}" for k in ("files", "reads", "environment", "network",
                                                                          "processes"))  # fmt: skip


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
def _send(fd: int, obj: Any) -> None:
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


def _recv(fd: int, limit: int = MAX_RESULT_BYTES + (1 << 20)) -> Any:
    (n,) = struct.unpack("<Q", _read_exactly(fd, 8))
    if n > limit:
        raise ValueError(f"a message of {n} bytes (over {limit})")
    return json.loads(_read_exactly(fd, n))


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
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
from rlvr.tools.isolation import serve
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
        finally:
            os.close(job_r)
            os.close(res_w)
        try:
            _send(self._job_w, init)
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
                    return _recv(self._res_r)
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
            rest[3] = _b64(rest[3])
        elif op == "close":
            rest[1] = _b64(rest[1])
        _send(self._job_w, [op, *rest])
        out = _recv(self._res_r)
        out["state"] = _unb64(out.get("state"))
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


# -- the server's side (runs in the server process) ------------------------------------------------------------------
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _mount(libc: Any, src: str | None, tgt: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    if libc.mount(enc(src), enc(tgt), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {tgt}: {os.strerror(e)}")


def _mounts() -> list[tuple[str, list[str]]]:
    """(mount point, per-mount options) of every mount of this mount namespace."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            out.append((point, fields[5].split(",")))
    return out


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def harden(covers: tuple[str, ...], read: list[str], write: list[str], scratch: str) -> None:
    """Make this mount namespace's view (module docstring): ``covers`` under empty tmpfs; ``read`` paths (folders
    or files) bound back read-only where a cover hides them; ``write`` folders bound read-write; a fresh tmpfs of
    :data:`SCRATCH_MB` on ``scratch`` (the calls' folders: in memory, gone with the server); every other mount
    read-only. Errors: ``OSError`` when a mount fails (other than one hidden by another)."""
    libc = _libc()
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    binds: dict[str, tuple[str, bool]] = {}  # target -> (source, writable)
    for p in read:
        for target in {os.path.abspath(p), os.path.realpath(p)}:
            if os.path.exists(p) and any(_under(target, c) for c in covers):
                binds[target] = (os.path.realpath(p), False)
    for p in write + [scratch]:
        binds[os.path.realpath(p)] = (os.path.realpath(p), True)
    fds = {target: os.open(src, os.O_PATH) for target, (src, _) in binds.items()}
    for d in covers:
        if os.path.isdir(d) and not os.path.islink(d):
            _mount(libc, "tmpfs", d, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=755")
    for target in sorted(binds, key=lambda t: (t.count("/"), t)):  # parents before what lies inside them
        fd = fds.pop(target)
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if not os.path.exists(target):
                open(target, "a").close()
        if target == os.path.realpath(scratch):
            _mount(libc, "tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={SCRATCH_MB}m,mode=711")
        else:
            _mount(libc, f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC)
        os.close(fd)
    writable = [t for t, (_, w) in binds.items() if w]
    readonly = [t for t, (_, w) in binds.items() if not w]
    for point, opts in _mounts():
        if _under(point, "/proc"):
            continue
        inside_rw = [w for w in writable if _under(point, w)]
        if inside_rw and not any(_under(point, r) and len(r) > max(map(len, inside_rw)) for r in readonly):
            continue
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
        for o in opts:
            flags |= _LOCKED_FLAGS.get(o, 0)
        if not any(o in ("relatime", "noatime") for o in opts):
            flags |= _MS_STRICTATIME
        try:
            _mount(libc, None, point, None, flags)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EINVAL):  # not a mount point here: hidden under another mount
                raise


def _drop_privileges(drop: tuple[int, int] | None) -> None:
    """Every capability gone for good (bounding set, ambient, securebits ``NOROOT``), then ``drop`` (uid, gid)
    when given; no new privileges. A non-root caller has none to drop: the calls that need one are skipped."""
    libc = _libc()
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    libc.prctl(_PR_SET_SECUREBITS, 0b11, 0, 0, 0)  # SECBIT_NOROOT | SECBIT_NOROOT_LOCKED
    if drop is not None:
        os.setgroups([])
        os.setgid(drop[1])
        os.setuid(drop[0])
        if os.getuid() != drop[0] or os.geteuid() != drop[0]:
            os._exit(71)

    class _Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class _Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    data = (_Data * 2)()
    if libc.capset(ctypes.byref(_Header(0x20080522, 0)), data) != 0 and drop is None and os.geteuid() == 0:
        os._exit(72)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        os._exit(73)


def _descendants(root: int) -> list[int]:
    """Live (not zombie) descendants of ``root``, from ``/proc/*/stat``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if rest[0] != "Z":
            children.setdefault(int(rest[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _reap() -> bool:
    """Reap every ended child; True when no child is left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


def _remove(folder: str) -> None:
    """Remove a call's folder, whatever modes it left inside."""
    for d, subdirs, _ in os.walk(folder):
        for s in subdirs:
            try:
                os.chmod(os.path.join(d, s), 0o700, follow_symlinks=False)
            except OSError:
                pass
    shutil.rmtree(folder, ignore_errors=True)


class _RelayGone(Exception):
    """The worker closed the job pipe."""


class _Jail:
    """The server's state: the resolved tools and the settings each call process gets (module docstring)."""

    def __init__(self, objs: dict[str, Any], init: dict[str, Any], job_fd: int) -> None:
        self.objs, self.job_fd = objs, job_fd
        self.iso = Isolation(init["mode"])
        self.pid_ns = self.iso.namespaces
        self.work, self.env, self.nproc = init["work"], init["env"], int(init["nproc"])
        self.network = bool(init["access"]["network"])
        self.drop = tuple(init["nobody"]) if self.iso.drops else None
        self.timeout_s, self.memory_mb = float(init["call_timeout_s"]), init["memory_mb"]
        self.max_output_chars = int(init["max_output_chars"])
        self.count = 0

    def run(self, job: list) -> dict[str, Any]:
        """One job in a call process of its own; its whole process tree killed after it."""
        self.count += 1
        folder = os.path.join(self.work, f"call-{self.count}")
        os.mkdir(folder, 0o700)
        if self.drop:
            os.chown(folder, *self.drop)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                self._child(job, folder, w)
            finally:
                os._exit(70)
        os.close(w)
        try:
            return self._wait(pid, r)
        finally:
            os.close(r)
            self.kill_calls(pid)
            _remove(folder)

    def _child(self, job: list, folder: str, w: int) -> None:
        import resource

        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, w)
        os.closerange(w + 1, 1 << 16)
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        nproc = self.nproc if hard == resource.RLIM_INFINITY else min(self.nproc, hard)
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if self.memory_mb is not None:
            mem = int(self.memory_mb) * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (mem, resource.getrlimit(resource.RLIMIT_AS)[1]))
        os.chdir(folder)
        os.environ.clear()
        os.environ.update({**self.env, "HOME": folder, "TMPDIR": folder})
        tempfile.tempdir = folder
        _drop_privileges(self.drop)
        _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if not self.network:
            from rlvr.tools.calls import no_network

            sys.addaudithook(no_network)
        result = self._job(job)
        try:
            _send(w, {**result, "state": _b64(result.get("state"))})
        except (TypeError, ValueError):
            _send(w, {"status": "error", "text": "the result does not travel as JSON", "cut": 0, "state": None})

    def _job(self, job: list) -> dict[str, Any]:
        from rlvr.tools.calls import run_job

        op = job[0]
        if op == "probe":
            return {"status": "ok", "text": json.dumps(_probe_facts()), "cut": 0, "state": None}
        if op == "probe_python":
            from rlvr_verifiers._sandbox import isolation

            iso = isolation()
            return {"status": "ok", "text": json.dumps([iso.mode, iso.prefix, iso.covers, iso.drop, iso.hook]),
                    "cut": 0, "state": None}  # fmt: skip
        if op == "call":
            _, target, method, arguments, state = job
            return run_job(self.objs, ("call", target, method, arguments, _unb64(state)), self.max_output_chars)
        if op == "close":
            return run_job(self.objs, ("close", job[1], _unb64(job[2])), self.max_output_chars)
        return run_job(self.objs, ("create", job[1]), self.max_output_chars)

    def _wait(self, pid: int, r: int) -> dict[str, Any]:
        """The call's result, or ``timeout``/``crashed``/an error when it sends none in time."""
        deadline = time.monotonic() + self.timeout_s
        pidfd = os.pidfd_open(pid)
        buf, watch, exited = bytearray(), [r, pidfd, self.job_fd], False
        try:
            while True:
                need = struct.unpack("<Q", buf[:8])[0] + 8 if len(buf) >= 8 else None
                if need is not None and need > MAX_RESULT_BYTES:
                    return {"status": "error", "text": f"the result is over {MAX_RESULT_BYTES} bytes", "cut": 0,
                            "state": None}  # fmt: skip
                if need is not None and len(buf) >= need:
                    return self._parse(bytes(buf[8:need]))
                if exited:
                    return {"status": "crashed", "text": "its process died", "cut": 0, "state": None}
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {"status": "timeout", "text": "", "cut": 0, "state": None}
                ready = select.select(watch, [], [], remaining)[0]
                if self.job_fd in ready:
                    raise _RelayGone
                if r in ready:
                    chunk = os.read(r, 1 << 20)
                    buf += chunk
                    if not chunk:
                        watch.remove(r)
                if pidfd in ready:
                    os.set_blocking(r, False)
                    try:
                        while chunk := os.read(r, 1 << 20):
                            buf += chunk
                    except (BlockingIOError, OSError):
                        pass
                    exited = True
        finally:
            os.close(pidfd)

    @staticmethod
    def _parse(data: bytes) -> dict[str, Any]:
        try:
            out = json.loads(data)
            ok = isinstance(out, dict) and out.get("status") in ("ok", "error") and isinstance(out.get("text"), str) \
                and isinstance(out.get("cut"), int) and isinstance(out.get("state"), (str, type(None)))
        except ValueError:
            ok = False
        if not ok:
            return {"status": "error", "text": "the call's result was not readable", "cut": 0, "state": None}
        return {k: out[k] for k in ("status", "text", "cut", "state")}

    def kill_calls(self, pid: int | None = None) -> None:
        """Kill and reap every process a call started: all of this PID namespace but the server, or (plain modes)
        the call's group and every descendant (the server is their subreaper)."""
        end = time.monotonic() + REAP_S
        if self.pid_ns:
            assert os.getpid() == 1, "kill(-1) only as the first process of a PID namespace"
            while True:
                try:
                    os.kill(-1, signal.SIGKILL)  # every process of this namespace but its first (this server)
                except ProcessLookupError:
                    pass
                if _reap() or time.monotonic() > end:
                    return
                time.sleep(0.002)
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        while True:
            left = _descendants(os.getpid())
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            if (_reap() and not left) or time.monotonic() > end:
                return
            time.sleep(0.002)


def _probe_facts() -> dict[str, Any]:
    """What a probe call sees (:func:`probe`)."""
    def writable(folder: str) -> bool:
        try:
            fd, path = tempfile.mkstemp(dir=folder)
        except OSError:
            return False
        os.close(fd)
        os.unlink(path)
        return True

    unreadable = [p for p in sys.path if os.path.isdir(p) and not os.access(p, os.R_OK | os.X_OK)]
    return {"folder_writable": writable(os.getcwd()), "root_writable": writable("/"), "unreadable": unreadable}


def serve(job_fd: int, res_fd: int, init: dict[str, Any]) -> None:
    """The server's body (module docstring): start (imports, mounts), answer ``ready``, then one job at a time until
    the job pipe closes; then kill what runs and exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the first process of a namespace: no signal a call can send
    jail = None
    try:
        iso = Isolation(init["mode"])
        if iso.namespaces and os.getpid() != 1:
            raise RuntimeError(f"{iso.mode}: the server is not the first process of its PID namespace")
        from rlvr.tools import builtins, calls  # noqa: F401 - imported before the view is narrowed
        from rlvr.tools.registry import resolve_target

        objs = {t: resolve_target(t) for t in init["targets"]}
        python_tool = any(getattr(o, "__module__", "") == builtins.__name__ and getattr(o, "__name__", "") in (
            "python", "PythonSession") for o in objs.values())  # fmt: skip
        if python_tool:
            import rlvr_verifiers._sandbox  # noqa: F401
        builtins.TIMEOUT_S = max(0.1, float(init["call_timeout_s"]) - min(0.5, 0.25 * float(init["call_timeout_s"])))
        builtins.MAX_OUTPUT_BYTES = max(1024, 4 * int(init["max_output_chars"]))
        if iso.namespaces:
            harden(COVERED_DIRS, _needed_paths(objs) + list(init["access"]["read"]), list(init["access"]["write"]),
                   init["work"])
        else:
            _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        os.chdir(init["work"])
        jail = _Jail(objs, init, job_fd)
        if python_tool:
            _python_sandbox(jail, builtins)
    except BaseException:  # noqa: BLE001 - reported to the worker, which fails the pool with it
        _send(res_fd, {"ready": False, "error": traceback.format_exc()})
        return
    _send(res_fd, {"ready": True})
    try:
        while True:
            try:
                job = _recv(job_fd)
            except (EOFError, OSError):
                break
            _send(res_fd, jail.run(job))
    except (_RelayGone, BrokenPipeError):
        pass
    finally:
        jail.kill_calls()


def _python_sandbox(jail: _Jail, builtins: Any) -> None:
    """Probe, as a call's user, which isolation the ``python`` tool's own sandbox (:mod:`rlvr_verifiers._sandbox`)
    gets inside this one, so every call inherits it instead of probing again."""
    from rlvr_verifiers._sandbox import Isolation as CodeIsolation

    saved = jail.timeout_s
    jail.timeout_s = 60.0
    try:
        out = jail.run(["probe_python"])
    finally:
        jail.timeout_s = saved
    if out["status"] != "ok":
        raise RuntimeError(f"the python tool's sandbox could not be probed: {out['status']} {out['text'][:300]}")
    mode, prefix, covers, drop, hook = json.loads(out["text"])
    builtins.ISOLATION = CodeIsolation(mode, tuple(prefix), tuple(covers), tuple(drop) if drop else None, hook)


def _needed_paths(objs: dict[str, Any]) -> list[str]:
    """What the tools need to run, to bind back read-only: the interpreter's prefixes and folder, every
    ``sys.path`` entry, each tool module's folder."""
    import inspect

    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             *[p for p in sys.path if p]]  # fmt: skip
    for obj in objs.values():
        try:
            paths.append(os.path.dirname(os.path.abspath(inspect.getfile(obj))))
        except (TypeError, OSError):
            pass
    return [p for p in dict.fromkeys(paths) if os.path.exists(p)]
