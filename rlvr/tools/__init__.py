"""Tool use: typed Python functions the model calls (:mod:`rlvr.tools.registry`), the call formats models write
(:mod:`rlvr.tools.formats`), bounded execution in worker processes (:mod:`rlvr.tools.execute`) and the tool
environment in the turn loop (:mod:`rlvr.tools.runner`). Heavy modules are imported where used."""
