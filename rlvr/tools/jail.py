"""The tool server's side of :mod:`rlvr.tools.isolation` (this code runs in the server process and in the call
processes it forks): the mount namespace's view (:func:`harden`), the drop of privileges, one process per job, the
kill of a call's whole process tree, and the server's loop (:func:`serve`). The module docstring of
:mod:`rlvr.tools.isolation` says what each mode gives."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from typing import Any

from rlvr.tools.isolation import (COVERED_DIRS, MAX_RESULT_BYTES, REAP_S, SCRATCH_MB, Isolation, b64, import_paths,
                                  recv_msg, send_msg, unb64)
from rlvr.tools.isolation import under as _under

_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_SECUREBITS = 1, 4, 24, 28
_PR_SET_NO_NEW_PRIVS, _PR_SET_CHILD_SUBREAPER, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 38, 36, 47, 4
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 2, 4, 8, 32, 4096, 16384
_MS_PRIVATE, _MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME, _MS_STRICTATIME = 1 << 18, 1024, 2048, 1 << 21, 1 << 24
_LOCKED_FLAGS = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "noatime": _MS_NOATIME,
                 "nodiratime": _MS_NODIRATIME, "relatime": _MS_RELATIME}  # fmt: skip


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


def harden(covers: tuple[str, ...], read: list[str], write: list[str], scratch: str) -> None:
    """Make this mount namespace's view (:mod:`rlvr.tools.isolation`): ``covers`` under empty tmpfs; ``read`` paths (folders
    or files) bound back read-only where a cover hides them; ``write`` folders bound read-write; a fresh tmpfs of
    :data:`SCRATCH_MB` on ``scratch`` (the calls' folders: a path under a cover, made there, so the host never
    sees it; in memory, gone with the server); every other mount read-only. Errors: ``OSError`` when a mount fails (other than one hidden by another)."""
    libc = _libc()
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    binds: dict[str, tuple[str, bool]] = {}  # target -> (source, writable)
    for p in read:
        for target in {os.path.abspath(p), os.path.realpath(p)}:
            if os.path.exists(p) and any(_under(target, c) for c in covers):
                binds[target] = (os.path.realpath(p), False)
    for p in write:
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
        _mount(libc, f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC)
        os.close(fd)
    if not any(_under(scratch, c) for c in covers):
        raise ValueError(f"the calls' folder {scratch} must lie under a covered folder ({', '.join(covers)})")
    os.makedirs(scratch, exist_ok=True)
    _mount(libc, "tmpfs", scratch, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={SCRATCH_MB}m,mode=711")
    writable = [t for t, (_, w) in binds.items() if w] + [scratch]
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
        self.paths = [p for p in sys.path if p and os.path.exists(p)]  # seen as the server's user
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
        libc = _libc()
        libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # its own /proc/self as usual (the server's stays closed)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if not self.network:
            from rlvr.tools.calls import no_network

            sys.addaudithook(no_network)
        result = self._job(job)
        try:
            send_msg(w, {**result, "state": b64(result.get("state"))})
        except (TypeError, ValueError):
            send_msg(w, {"status": "error", "text": "the result does not travel as JSON", "cut": 0, "state": None})

    def _job(self, job: list) -> dict[str, Any]:
        from rlvr.tools.calls import run_job

        op = job[0]
        if op == "probe":
            return {"status": "ok", "text": json.dumps(_probe_facts(self.paths)), "cut": 0, "state": None}
        if op == "probe_python":
            from rlvr_verifiers._sandbox import isolation

            iso = isolation()
            return {"status": "ok", "text": json.dumps([iso.mode, iso.prefix, iso.covers, iso.drop, iso.hook]),
                    "cut": 0, "state": None}  # fmt: skip
        if op == "call":
            _, target, method, arguments, state = job
            return run_job(self.objs, ("call", target, method, arguments, unb64(state)), self.max_output_chars)
        if op == "close":
            return run_job(self.objs, ("close", job[1], unb64(job[2])), self.max_output_chars)
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


def _probe_facts(paths: list[str]) -> dict[str, Any]:
    """What a probe call sees (:func:`rlvr.tools.isolation.probe`); ``paths``: the ``sys.path`` entries that exist
    for the server."""
    def writable(folder: str) -> bool:
        try:
            fd, path = tempfile.mkstemp(dir=folder)
        except OSError:
            return False
        os.close(fd)
        os.unlink(path)
        return True

    unreadable = [p for p in paths if not os.access(p, os.R_OK)]
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
            harden(COVERED_DIRS, list(import_paths(objs)) + list(init["access"]["read"]), list(init["access"]["write"]),
                   init["work"])
        else:
            _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        os.chdir(init["work"])
        jail = _Jail(objs, init, job_fd)
        if python_tool:
            _python_sandbox(jail, builtins)
    except BaseException:  # noqa: BLE001 - reported to the worker, which fails the pool with it
        send_msg(res_fd, {"ready": False, "error": traceback.format_exc()})
        return
    send_msg(res_fd, {"ready": True})
    try:
        while True:
            try:
                job = recv_msg(job_fd)
            except (EOFError, OSError):
                break
            send_msg(res_fd, jail.run(job))
    except (_RelayGone, BrokenPipeError):
        pass
    finally:
        jail.kill_calls()
        if not jail.pid_ns:  # the calls' folders are on the host's disk (in the ns-* modes: a tmpfs of this server)
            shutil.rmtree(jail.work, ignore_errors=True)


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

