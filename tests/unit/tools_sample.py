"""Tools for the tool tests (imported by the tool workers: standard library only)."""

import time


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def sleep_forever(seconds: float) -> str:
    """Sleep (for the timeout test).

    Args:
        seconds: How long (ignored: forever).
    """
    while True:
        time.sleep(1)


def flood(n: int) -> str:
    """Print n characters, then return "end".

    Args:
        n: How many characters to print.
    """
    print("x" * n)
    return "end"


def fetch(url: str) -> str:
    """Open a connection to an internet host.

    Args:
        url: A host name.
    """
    import socket

    with socket.create_connection((url, 80), timeout=2) as s:
        return str(s.getpeername())


def garbage(x: int) -> str:
    """Return something that is not text.

    Args:
        x: Anything.
    """
    return object()


def die(x: int) -> str:
    """Kill its own process.

    Args:
        x: Anything.
    """
    import os

    os._exit(1)
