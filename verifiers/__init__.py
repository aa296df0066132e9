"""Built-in verifier plugins of rlvr, installed under the import name ``rlvr_verifiers``.

The top-level folder is ``verifiers/`` in the repository; a distribution named ``verifiers`` already exists on
PyPI, so ``pyproject.toml`` maps this folder to ``rlvr_verifiers``. Recipes name these by short name
(``math``, ``numeric``, ``gsm8k``, ``countdown``, ``code``, ``format``, ``choice``, ``reasoning_gym``, ``environment``) through
:data:`rlvr.reward.base.VERIFIERS`; docs/verifiers.md describes each one's policy and how to write your own.

Modules import their heavy dependencies (math-verify) where they are used, so importing this package is cheap.
"""

from __future__ import annotations

BUILTINS: dict[str, str] = {
    "math": "rlvr_verifiers.math:MathVerifier",
    "numeric": "rlvr_verifiers.numeric:NumericVerifier",
    "countdown": "rlvr_verifiers.countdown:CountdownVerifier",
    "format": "rlvr_verifiers.format:FormatVerifier",
    "choice": "rlvr_verifiers.choice:ChoiceVerifier",
    "gsm8k": "rlvr_verifiers.gsm8k:Gsm8kVerifier",
    "code": "rlvr_verifiers.code:CodeVerifier",
    "reasoning_gym": "rlvr_verifiers.reasoning_gym:ReasoningGymVerifier",
    "environment": "rlvr_verifiers.environment:EnvironmentVerifier",
}
"""Short name -> ``module:attr`` of each built-in verifier (loaded lazily by ``rlvr.reward.base``)."""

__all__ = ["BUILTINS"]
