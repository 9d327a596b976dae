"""Hostlists and drain reasons (the recorded answers of each Slurm version: test_slurm_versions.py)."""

import pytest

from sigma.slurm.client import sigma_reason
from sigma.slurm.types import expand_hostlist, job_state_name


@pytest.mark.parametrize("expr,names", [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("node[1,3-4],gpu[009-011]", ["node1", "node3", "node4", "gpu009", "gpu010", "gpu011"]),
    ("", []),
    ("(null)", []),
])
def test_expand_hostlist(expr, names):
    assert expand_hostlist(expr) == names


def test_reason_always_prefixed():
    assert sigma_reason("xid-79   GPU fallen off the bus") == "sigma: xid-79 GPU fallen off the bus"
    assert sigma_reason("sigma: already") == "sigma: already"


@pytest.mark.parametrize("states,name", [
    (("PENDING", "COMPLETING"), "COMPLETING"),  # a requeued job whose old run is still ending
    (("PENDING", "REQUEUED"), "REQUEUED"),  # sacct's record of a requeued run
    (("RUNNING",), "RUNNING"),
    (("PENDING",), "PENDING"),
])
def test_job_state_named_as_squeue_prints_it(states, name):
    assert job_state_name(states) == name
