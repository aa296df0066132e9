"""Imported by environment workers that run the verifiers adapter (``VerifiersEnv.preload_modules``): imports
``verifiers.v1`` once as the worker starts (:func:`rlvr.envs.verifiers_env.import_vf`, which also gets past rlvr's own
``verifiers/`` folder shadowing the name). Without the package it does nothing: the adapter's reset says what to
install."""

from __future__ import annotations

try:
    from rlvr.envs.verifiers_env import import_vf

    import_vf()
except ImportError:  # pragma: no cover - the reset names the missing package
    pass
