"""One tool job, run in the process it is given: the code a call's own process runs inside the isolation of
:mod:`rlvr.tools.isolation` (it knows nothing of processes, pipes or limits).

Jobs (tuples of JSON values and bytes):

- ``("call", target, method, arguments, state)``: a function call (``method`` None, ``state`` None) or a method
  called on the instance ``state`` (its pickle) unpickles to; the instance is pickled back after an ``ok`` call (a
  call that raises, or leaves an instance that does not pickle, is an error and changes nothing);
- ``("create", target)``: a new instance of the stateful tool class ``target``, pickled;
- ``("close", target, state)``: the instance's ``close()``.

Each gives a dict of JSON values and bytes (:func:`run_job`): ``status`` (``ok`` or ``error``), ``text`` (what the
model is shown, or what went wrong), ``cut`` (characters cut by the output cap), ``state`` (a pickle, or None).

What a call prints and what it returns together are capped at ``max_output_chars`` (the end is cut:
``... [N characters cut]``). The value must be text, None (empty) or a JSON value; anything else is an error.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
from typing import Any

STATE_MUST_PICKLE = ("a stateful tool's state must pickle (it is kept with the trajectory, pickled, between calls): "
                     "keep only picklable values (numbers, text, lists, dicts...) in its attributes")
NETWORK_REFUSED = "network access is disabled for tools"


class _Capped(io.TextIOBase):
    """A text stream keeping its first ``cap`` characters and counting the rest (a tool that prints 1 GB costs no
    memory)."""

    def __init__(self, cap: int) -> None:
        self.cap, self.head, self.total = cap, [], 0
        self._kept = 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        s = str(s)
        self.total += len(s)
        room = self.cap - self._kept if self.cap > 0 else len(s)
        if room > 0:
            self.head.append(s[:room])
            self._kept += min(room, len(s))
        return len(s)


def no_network(event: str, args: tuple) -> None:
    """An audit hook (``sys.addaudithook``) refusing internet sockets (AF_INET 2, AF_INET6 10) and name lookups with
    ``PermissionError``. Python-level only: C code calling libc directly passes it (the network namespace of the
    ``ns-*`` modes does not depend on it)."""
    if event == "socket.__new__" and len(args) > 1 and args[1] in (2, 10):
        raise PermissionError(NETWORK_REFUSED)
    if event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr"):
        raise PermissionError(NETWORK_REFUSED)
    if event in ("socket.connect", "socket.bind", "socket.sendto") and args and \
            getattr(args[0], "family", None) in (2, 10):
        raise PermissionError(NETWORK_REFUSED)


def _text(value: Any) -> str:
    """A tool's return value as text: a string as is, None as empty, JSON-able values as JSON.
    Errors: ``TypeError`` for anything else (the call is reported as returning garbage)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        raise TypeError(f"the tool returned a {type(value).__name__}, not text or a JSON value") from None


def _pickled(obj: Any) -> bytes:
    """``obj``'s pickle; ``TypeError`` naming its class and saying why state must pickle."""
    try:
        return pickle.dumps(obj)
    except Exception as e:  # noqa: BLE001 - pickling raises TypeError, PicklingError, AttributeError...
        raise TypeError(f"the {type(obj).__name__} instance does not pickle ({type(e).__name__}: {str(e)[:200]}); "
                        f"{STATE_MUST_PICKLE}") from None


def _result(status: str, text: str, cut: int = 0, state: bytes | None = None) -> dict[str, Any]:
    return {"status": status, "text": text, "cut": cut, "state": state}


def _lifecycle(cls: Any, job: tuple) -> dict[str, Any]:
    if job[0] == "create":
        try:
            instance = cls()
        except Exception as e:  # noqa: BLE001 - the model is told; the trajectory goes on
            return _result("error", f"{cls.__name__}() failed: {type(e).__name__}: {str(e)[:500]}")
        try:
            return _result("ok", "", state=_pickled(instance))
        except TypeError as e:
            return _result("error", str(e))
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            pickle.loads(job[2]).close()
        return _result("ok", "")
    except Exception as e:  # noqa: BLE001 - reported to the runner, which counts and logs it
        return _result("error", f"{cls.__name__}.close() failed: {type(e).__name__}: {str(e)[:500]}")


def run_job(objs: dict[str, Any], job: tuple, max_output_chars: int) -> dict[str, Any]:
    """Run ``job`` (module docstring) with the resolved tools ``objs`` (target -> function or class) in this
    process. Never raises for what the tool does (an exception is an ``error`` result)."""
    if job[0] != "call":
        return _lifecycle(objs[job[1]], job)
    _, target, method, arguments, state = job
    out = _Capped(max_output_chars)
    new_state = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            if method is None:
                value = _text(objs[target](**arguments))
            else:
                instance = pickle.loads(state)
                value = _text(getattr(instance, method)(**arguments))
        if method is not None:
            new_state = _pickled(instance)
    except Exception as e:  # noqa: BLE001 - a tool's failure is the model's information, not a crash
        return _result("error", f"{type(e).__name__}: {str(e)[:500]}")
    printed, whole = "".join(out.head), out.total + len(value)  # printed: the first max_output_chars
    if max_output_chars > 0 and whole > max_output_chars:
        cut = whole - max_output_chars
        return _result("ok", (printed + value)[:max_output_chars] + f"... [{cut} characters cut]", cut, new_state)
    return _result("ok", printed + value, 0, new_state)
