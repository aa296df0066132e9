"""GSM8K: the number after ``#### `` in the response, else its last number, against a numeric gold.

An alias of :class:`rlvr_verifiers.numeric.NumericVerifier` (same extraction, commas as thousands separators,
``$`` and ``%`` ignored, relative tolerance) that also accepts a full GSM8K solution as the gold (the number after
its last ``####``) and checks golds at load time.
"""

from __future__ import annotations

from rlvr_verifiers.numeric import NumericVerifier, parse_gold_number


class Gsm8kVerifier(NumericVerifier):
    """:class:`~rlvr_verifiers.numeric.NumericVerifier` under the name ``gsm8k``, with :meth:`check_gold`.

    Args: ``tolerance`` as NumericVerifier. Errors: ``ValueError`` for a negative tolerance.
    """

    def check_gold(self, gold: str) -> str | None:
        """None when the gold is one number (``"1,000"``, ``"#### 42"``, ``"$5"``), else the reason."""
        if parse_gold_number(gold, self.units) is None:
            hint = " (a number with a label: reward.verifiers args units: number)" if self.units == "refuse" else ""
            return f"gold {str(gold)[:60]!r} is not one number{hint}"
        return None
