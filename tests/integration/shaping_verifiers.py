"""Verifiers used by integration tests through the ``path/to/file.py:name`` plugin form."""


def digit_share(response: str, gold: str, **row) -> float:
    """Share of the response's characters that are digits (0 for an empty response): a dense, learnable signal."""
    return sum(ch.isdigit() for ch in response) / len(response) if response else 0.0


def non_empty(response: str, gold: str, **row) -> float:
    """1 for any non-empty response: every sample of a random model counts as "solved" (DPH-RL buffer tests)."""
    return 1.0 if response else 0.0


def has_digit(response: str, gold: str, **row) -> float:
    """1 when the response holds a digit, else 0: a BINARY reward a random model earns about half the time, so
    groups are mixed (the pass@k estimators need 0/1 rewards; DAPO's filter and DPH-RL's buffer need correct ones)."""
    return 1.0 if any(ch.isdigit() for ch in response) else 0.0


class DigitShareOrDie:
    """:func:`digit_share`, except that once the file ``arm`` exists the first sample to see it kills its worker
    process (SIGKILL's exit, as the OOM killer would), leaving ``arm + ".fired"`` behind: a verifier worker lost
    with the sample it held (the chaos test, issue 41). Never armed: exactly :func:`digit_share`."""

    def __init__(self, arm: str) -> None:
        self.arm = arm

    def verify(self, response: str, gold: str, **row) -> float:
        import os

        if os.path.exists(self.arm) and not os.path.exists(self.arm + ".fired"):
            open(self.arm + ".fired", "w").close()
            os._exit(137)
        return digit_share(response, gold)
