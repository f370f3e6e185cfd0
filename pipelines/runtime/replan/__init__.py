"""Live re-plan (Gloss, Rajadurai et al., ASPLOS 2018): a new query generation that
changes the key groups or the plan while the old one runs, an arbiter that forwards
each epoch's output exactly once and the hand-over between them (``gloss``), and the
state transfer into the new generation (``transfer``)."""
