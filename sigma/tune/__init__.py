"""`sigma tune`: a pruned search of training layouts (tp x pp x ep x vpp x micro-batch size, dp from the rest).

Phase 1 measures this platform's costs with short profiling jobs (profile.py) and fits a cost model (cost.py);
phase 2 enumerates the layouts (space.py), drops those the memory model says do not fit, ranks the rest by the
cost model, prunes dominated ones and measures only the few best for real (tuner.py).
"""
