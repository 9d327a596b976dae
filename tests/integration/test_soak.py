"""A short chaos soak: the platform up, a 2-node training job, one fault down each path into the platform (the log
kind injects one catalogue signature; bench/chaos_soak.py runs every kind and samples every signature).

Runs bench/chaos_soak.py's code on the test cluster, so the soak doubles as the end-to-end test of the whole loop:
inject -> detect -> act on the right node -> the training job resumes from its checkpoint -> the node comes back.
"""

import importlib.util
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration

# One fault of each path into the platform: the watchdog (hang), the node health checks (prolog) and the kernel log
# (a catalogue signature). Every kind runs end to end in its own integration test (xid, node death and NaN in
# test_jit_checkpoint, straggler in test_isolation) and all of them in `make soak`; this run keeps the soak's own
# machinery (inject, score, undo, the report) tested within the suite's time.
KINDS = ["hang", "prolog", "log"]
# The log kind's signature, named: sampled with a fixed seed, the catalogue's growth would change which one runs here
# (and how long this test takes); `make soak` samples them all.
SIGNATURE = "gpu-xid-power-smoothing"


def _soak_module():
    spec = importlib.util.spec_from_file_location("chaos_soak", REPO / "bench" / "chaos_soak.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos_soak"] = module
    spec.loader.exec_module(module)
    return module


def test_short_soak_one_fault_of_each_kind(slurm, cluster):
    soak_mod = _soak_module()
    soak = soak_mod.Soak(cluster.state_dir, seed=1, hang_timeout=20, settle_s=8, fault_timeout=150,
                         say=lambda s: print(s, flush=True), per_round=1, signatures=[SIGNATURE])
    try:
        res = soak.run(0, KINDS, port_base=cluster.load_spec().port_base)
    finally:
        soak.stop_platform()
    soak_mod.print_result(res)
    assert sorted(r.kind for r in res.rows) == sorted(KINDS)
    for r in res.rows:
        assert r.detected, f"{r.kind} on {r.node} not detected"
        assert r.right_node, f"{r.kind} on {r.node}: acted on {r.acted_nodes}"
        assert r.recovered, f"{r.kind} on {r.node}: training job {r.job_id} did not resume"
        if r.job_affected:
            assert r.steps_lost is not None and r.steps_lost <= soak_mod.CHECKPOINT_EVERY, r
        assert r.node_back_ts is not None, f"{r.node} not back in service after {r.kind}"
    assert res.false_drains == []
    assert res.lost_jobs == 0
