"""Run untrusted Python (a model's completion plus its tests) in a contained subprocess.

One run (:func:`run_python`) is one fresh interpreter, ``python -I -S`` (isolated: no site-packages, no user
site, ``PYTHON*`` variables ignored; the real interpreter behind a venv, so only the standard library is
importable), in a fresh temporary folder that is its working directory and is deleted afterwards:

- **Tests never touch disk.** The program and the tests go to the runner through stdin; it reads stdin to the
  end and replaces it with ``/dev/null`` before any untrusted code runs. (They share the process with the
  completion, as in HumanEval's own harness, so a completion that inspects its caller's frames can still read
  them from memory; the sandbox keeps them off the file system and the command line.)
- **Resource limits**, set in ``preexec_fn`` before the exec and inherited by every descendant: ``RLIMIT_CPU``
  (``ceil(timeout_s) + 1`` s soft, one more hard), ``RLIMIT_AS`` (``memory_mb``), ``RLIMIT_FSIZE``
  (``max_output_bytes`` per file), ``RLIMIT_NPROC`` (``nproc`` processes and threads; counted per user id
  across all runs of that user at once; not enforced for root, so it binds only after the drop to ``nobody``
  or for a non-root caller), ``RLIMIT_NOFILE`` (64).
- **Kill the whole tree.** The run is a new session (its own process group); at the wall-clock limit, at the
  output cap, and after every run, the group is sent SIGKILL (``os.killpg``) and so is the PID namespace's
  init where there is one, which makes the kernel kill every process left in that namespace, including ones
  that left the group with ``setsid``.
- **Environment stripped** to ``PATH``, ``LANG`` and ``HOME`` (the temporary folder).
- **Output capped**: stdout and stderr share one pipe read by the parent; past ``max_output_bytes`` the run is
  killed and reports ``output_limit``.

Isolation mode, probed once per process (:func:`isolation`), the first that runs a probe program:

1. ``ns-root`` (running as root, ``unshare`` usable): ``unshare --net --mount --pid --fork --mount-proc``. No
   network (a new network namespace holds only a loopback device that is down); its own PID namespace and
   ``/proc``; in its own mount namespace the runner (still root) covers ``/tmp``, ``/var/tmp``, ``/dev/shm``,
   ``/run/lock``, ``/root`` and ``/home`` with empty root-owned tmpfs (mode 755), binds the temporary folder and
   the interpreter's prefix back at their own paths, then drops to the user ``nobody`` (``setgroups([])``,
   ``setgid``, ``setuid``). The completion can then write only inside its folder: the rest of the file system
   is root's, read-only to ``nobody``, and the world-writable folders are covered.
2. ``ns-user`` (not root, unprivileged user namespaces allowed): ``unshare --map-root-user --net --pid --fork
   --mount-proc``. No network, own PID namespace; files: whatever the calling user may write.
3. ``plain-nobody`` (root, no namespaces, the interpreter readable by ``nobody``): the runner drops to
   ``nobody``; network blocked by an audit hook (``sys.addaudithook``) that raises ``PermissionError`` on
   ``socket.__new__`` for AF_INET/AF_INET6 and on connect/bind/sendto/sendmsg/getaddrinfo (C code calling
   libc directly, e.g. through ``ctypes``, gets past it). Files: what ``nobody`` may write (``/tmp`` too).
4. ``plain``: no namespaces, no user change; the audit hook only. Files: whatever the calling user may write.

Without a PID namespace (modes 3, 4) a child that leaves the process group with ``setsid`` outlives the run
(``RLIMIT_NPROC`` still bounds how many there can be).

Thread safety: ``run_python`` may be called from several threads at once (each run has its own folder and
pipes). ``preexec_fn`` runs between fork and exec; it only calls ``setrlimit``.
"""

from __future__ import annotations

import json
import math
import os
import pwd
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

NOFILE = 64
"""``RLIMIT_NOFILE`` of a run (open file descriptors)."""
COVERED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/root", "/home")
"""Folders hidden under empty root-owned tmpfs in ``ns-root`` mode (world-writable ones, and homes)."""
_ENV_PATH = "/usr/local/bin:/usr/bin:/bin"
_UNSHARE_ROOT = ("unshare", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc")
_UNSHARE_USER = ("unshare", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount-proc")

# The runner: the first code the sandboxed interpreter runs (given with -c, so nothing of it is on disk).
# It reads its job from stdin as JSON, hardens the mount namespace and drops privileges when told to, then
# runs program, tests and ``check(<call>)`` in one fresh __main__ namespace and writes one record to the
# result pipe: "ok <token>", "memory" or "failed: <ExcType>". Forked children never write a record.
RUNNER = r"""
import os, sys, json
def _mount(libc, src, tgt, fstype, flags, data):
    import ctypes
    enc = lambda s: None if s is None else s.encode()
    if libc.mount(enc(src), enc(tgt), enc(fstype), flags, enc(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "mount " + tgt + ": " + os.strerror(e))
def _harden(covers, binds):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fds = {p: os.open(p, os.O_PATH) for p in binds}
    for d in covers:
        if os.path.isdir(d) and not os.path.islink(d):
            _mount(libc, "tmpfs", d, "tmpfs", 2 | 4, "size=256k,mode=755")
    for p, fd in fds.items():
        if not os.path.isdir(p) or os.stat(p).st_ino != os.fstat(fd).st_ino:
            os.makedirs(p, exist_ok=True)
            _mount(libc, "/proc/self/fd/%d" % fd, p, None, 4096 | 16384, None)
        os.close(fd)
    return libc
def _pdeathsig():
    import ctypes
    ctypes.CDLL(None).prctl(1, 9)
def _no_net(event, args):
    if event == "socket.__new__" and len(args) > 1 and args[1] in (2, 10):
        raise PermissionError("network disabled in the sandbox")
    if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo"):
        raise PermissionError("network disabled in the sandbox")
def _main():
    job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    me, res = os.getpid(), job["result_fd"]
    if job["covers"]:
        _harden(job["covers"], [job["workdir"], sys.base_prefix])
        os.chdir(job["workdir"])
    if job["drop"]:
        os.setgroups([])
        os.setgid(job["drop"][1])
        os.setuid(job["drop"][0])
        if os.getuid() != job["drop"][0]:
            os._exit(3)
    if job["pdeathsig"]:
        _pdeathsig()
    if job["hook"]:
        sys.addaudithook(_no_net)
    program, tests, call, token = job["program"], job["tests"], job["call"], job["token"]
    del job
    g = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(program, "<completion>", "exec"), g)
        if tests:
            exec(compile(tests, "<tests>", "exec"), g)
        if call:
            exec(compile("check(" + call + ")", "<check>", "exec"), g)
        out = "ok " + token
    except MemoryError:
        out = "memory"
    except BaseException as e:
        out = "failed: " + type(e).__name__
    if os.getpid() == me:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:
                pass
        try:
            os.write(res, (out + "\n").encode())
        except OSError:
            pass
    os._exit(0)
_main()
"""


@dataclass(frozen=True)
class Limits:
    """Limits of one run: wall-clock ``timeout_s`` (seconds), ``memory_mb`` (address space, MiB),
    ``max_output_bytes`` (stdout + stderr, and each file written), ``nproc`` (processes and threads of the
    run's user id)."""

    timeout_s: float = 10.0
    memory_mb: int = 512
    max_output_bytes: int = 1 << 20
    nproc: int = 64


@dataclass(frozen=True)
class Isolation:
    """How runs are isolated (see the module docstring): ``mode`` name, the ``unshare`` command prefix, the
    folders to cover, the (uid, gid) to drop to, whether the socket audit hook is installed."""

    mode: str
    prefix: tuple[str, ...] = ()
    covers: tuple[str, ...] = ()
    drop: tuple[int, int] | None = None
    hook: bool = True

    def describe(self) -> str:
        """One line naming the active mechanisms."""
        net = "audit hook on sockets" if self.hook else "network namespace"
        fs = "user nobody" if self.drop else "calling user"
        if self.covers:
            fs += " + tmpfs over " + ",".join(self.covers)
        pid = "PID namespace" if "--pid" in self.prefix else "process group"
        return (
            f"{self.mode}: net={net}; files={fs}; kill={pid}; "
            "rlimits=CPU,AS,FSIZE,NPROC,NOFILE; tests via stdin; env stripped"
        )


@dataclass(frozen=True)
class RunResult:
    """Outcome of one run: ``status`` is ``ok`` or one of ``failed: <ExcType>``, ``memory``, ``timeout``,
    ``output_limit``, ``crashed``; ``output`` the first ``max_output_bytes`` of stdout + stderr;
    ``elapsed_s`` wall-clock seconds from start to end; ``returncode`` of the direct child (None if killed
    before it was reaped)."""

    status: str
    output: bytes
    elapsed_s: float
    returncode: int | None


def interpreter() -> str:
    """The real interpreter behind ``sys.executable`` (a venv's python is a link to it)."""
    return os.path.realpath(sys.executable)


def _nobody() -> tuple[int, int]:
    try:
        pw = pwd.getpwnam("nobody")
        return pw.pw_uid, pw.pw_gid
    except KeyError:
        return 65534, 65534


def _preexec(limits: Limits):
    cpu = math.ceil(limits.timeout_s) + 1
    mem = limits.memory_mb * 2**20

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_output_bytes, limits.max_output_bytes))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.nproc, limits.nproc))
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

    return apply


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the children of ``proc`` (a PID namespace's init dies with its whole namespace), then its group."""
    try:
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            children = [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        children = []
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def _pump(proc: subprocess.Popen, payload: bytes, res_r: int, limits: Limits, start: float):
    """Feed stdin, collect output and result records until the child exits, the deadline passes or the
    output cap is hit. Returns ``(status or None, output, records)``."""
    sel = selectors.DefaultSelector()
    out, rec = bytearray(), bytearray()
    stdin, stdout = proc.stdin.fileno(), proc.stdout.fileno()
    for fd in (stdin, stdout, res_r):
        os.set_blocking(fd, False)
    sel.register(stdin, selectors.EVENT_WRITE, "in")
    sel.register(stdout, selectors.EVENT_READ, "out")
    sel.register(res_r, selectors.EVENT_READ, "res")
    pidfd = os.pidfd_open(proc.pid) if hasattr(os, "pidfd_open") else None
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ, "exit")
    pos, status, deadline = 0, None, start + limits.timeout_s
    try:
        while status is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                status = "timeout"
                break
            exited = proc.poll() is not None
            for key, _ in sel.select(min(remaining, 0.05 if pidfd is None else remaining)):
                if key.data == "in":
                    try:
                        pos += os.write(stdin, payload[pos : pos + 65536])
                    except BlockingIOError:
                        continue
                    except OSError:  # the child is gone or closed its stdin
                        pos = len(payload)
                    if pos >= len(payload):
                        sel.unregister(stdin)
                        proc.stdin.close()
                elif key.data == "exit":
                    exited = True
                else:
                    buf = out if key.data == "out" else rec
                    if not _drain(key.fd, buf, sel):
                        continue
                    if len(out) > limits.max_output_bytes:
                        status = "output_limit"
            if exited or proc.poll() is not None:
                _drain(stdout, out, None)
                _drain(res_r, rec, None)
                if len(out) > limits.max_output_bytes:
                    status = "output_limit"
                break
    finally:
        sel.close()
        if pidfd is not None:
            os.close(pidfd)
    return status, bytes(out[: limits.max_output_bytes]), rec.decode("utf-8", "replace").splitlines()


def _drain(fd: int, buf: bytearray, sel: selectors.BaseSelector | None) -> bool:
    """Read what ``fd`` has now into ``buf`` (at most 1 MiB + 64 KiB per call); unregister it at EOF."""
    for _ in range(17):
        try:
            data = os.read(fd, 65536)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            data = b""
        if not data:
            if sel is not None and fd in sel.get_map():
                sel.unregister(fd)
            return False
        buf += data
    return True


def run_python(
    program: str, tests: str, call: str | None, limits: Limits, iso: Isolation | None = None
) -> RunResult:
    """Run ``program``, then ``tests``, then ``check(<call>)`` (when ``call`` is given) in a sandbox.

    Returns a :class:`RunResult` (never raises for anything the code does). ``iso`` defaults to
    :func:`isolation`. Errors: ``OSError`` only when the sandbox itself cannot start (no ``unshare`` binary
    after the probe found one, out of file descriptors).
    """
    iso = iso or isolation()
    token = secrets.token_hex(16)
    workdir = tempfile.mkdtemp(prefix="rlvr-code-")
    res_r, res_w = os.pipe()
    proc = None
    start = time.monotonic()
    try:
        if iso.drop:
            os.chown(workdir, *iso.drop)
        job = {
            "program": program, "tests": tests, "call": call, "token": token, "result_fd": res_w,
            "workdir": workdir, "covers": list(iso.covers), "drop": list(iso.drop) if iso.drop else None,
            "hook": iso.hook, "pdeathsig": bool(iso.prefix),
        }  # fmt: skip
        cmd = [*iso.prefix, interpreter(), "-I", "-S", "-c", RUNNER]
        env = {"PATH": _ENV_PATH, "LANG": "C.UTF-8", "HOME": workdir}
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=workdir,
            env=env, pass_fds=(res_w,), start_new_session=True, preexec_fn=_preexec(limits),
        )  # fmt: skip
        os.close(res_w)
        res_w = -1
        status, output, records = _pump(proc, json.dumps(job).encode(), res_r, limits, start)
        _kill_tree(proc)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        elapsed = time.monotonic() - start
        if status is None:
            status = _status(records, token, proc.returncode)
        return RunResult(status=status, output=output, elapsed_s=elapsed, returncode=proc.returncode)
    finally:
        if proc is not None:
            _kill_tree(proc)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None and not stream.closed:
                    stream.close()
            if proc.returncode is None:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        for fd in (res_r, res_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)


def _status(records: list[str], token: str, returncode: int | None) -> str:
    if records and all(r == f"ok {token}" for r in records):
        return "ok"
    for r in records:
        if r != f"ok {token}":
            return r if r == "memory" or r.startswith("failed: ") else "crashed"
    if returncode == -signal.SIGXCPU:
        return "timeout"
    return "crashed"


_ISOLATION: Isolation | None = None
_ISOLATION_LOCK = threading.Lock()
_PROBE = "import json, decimal, collections\nassert json.loads('[1]') == [1]\n"


def _candidates() -> list[Isolation]:
    root = os.geteuid() == 0
    have_unshare = shutil.which("unshare") is not None
    out = []
    if root and have_unshare:
        out.append(Isolation("ns-root", _UNSHARE_ROOT, COVERED_DIRS, _nobody(), hook=False))
    if not root and have_unshare:
        out.append(Isolation("ns-user", _UNSHARE_USER, (), None, hook=False))
    if root:
        out.append(Isolation("plain-nobody", (), (), _nobody(), hook=True))
    out.append(Isolation("plain", (), (), None, hook=True))
    return out


def isolation(refresh: bool = False) -> Isolation:
    """The isolation mode of this process: the first candidate (module docstring) that runs a probe program
    (imports from the standard library) to ``ok``. Probed once (about 0.1 s per candidate), then cached;
    ``refresh=True`` probes again."""
    global _ISOLATION
    with _ISOLATION_LOCK:
        if _ISOLATION is not None and not refresh:
            return _ISOLATION
        limits = Limits(timeout_s=10.0, memory_mb=512, max_output_bytes=1 << 16, nproc=64)
        candidates = _candidates()
        for iso in candidates:
            try:
                if run_python(_PROBE, "", None, limits, iso).status == "ok":
                    _ISOLATION = iso
                    break
            except OSError:
                continue
        else:
            _ISOLATION = candidates[-1]
        return _ISOLATION


def with_mode(mode: str) -> Isolation:
    """The candidate isolation named ``mode`` on this machine (for tests). Errors: ``KeyError`` if it is not
    a candidate here (``ns-root`` and ``plain-nobody`` need root; ``ns-user`` needs a non-root user)."""
    for iso in _candidates():
        if iso.mode == mode:
            return iso
    raise KeyError(mode)


__all__ = ["Isolation", "Limits", "RunResult", "isolation", "run_python", "with_mode", "interpreter"]
