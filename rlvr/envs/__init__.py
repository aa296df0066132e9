"""Multi-turn environments: the seam (an environment speaks messages; rlvr owns the tokens) and the token-exact
assembly of trajectories (:mod:`rlvr.envs.tokens`)."""
