"""``rlvr serve``: the Tinker training API (the ``tinker`` SDK's HTTP routes) on rlvr's trainer and engines.

- :mod:`rlvr.serve.app`: the routes (Starlette) and :func:`~rlvr.serve.app.serve`;
- :mod:`rlvr.serve.server`: what each call does (sessions, models, sampling sessions, checkpoints);
- :mod:`rlvr.serve.models`: one training model's roles and the sampling batcher;
- :mod:`rlvr.serve.trainer`: the trainer rank with the split update (forward_backward, optim_step);
- :mod:`rlvr.serve.futures`: request ids, lanes, bounded waits;
- :mod:`rlvr.serve.wire`: the protobuf bodies.

The losses are :mod:`rlvr.algos.tinker_losses`. See docs/serve.md.
"""
