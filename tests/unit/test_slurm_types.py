"""Typed results parsed from JSON recorded on the real local cluster."""

import json

import pytest

from sigma.slurm.client import sigma_reason
from sigma.slurm.types import AccountingRecord, Job, Node, expand_hostlist
from tests.conftest import FIXTURES


def load(name):
    return json.loads((FIXTURES / "slurm" / name).read_text())


def test_sinfo_nodes_and_sigma_drain():
    nodes = {n.name: n for n in map(Node.from_json, load("sinfo.json")["nodes"])}
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    assert nodes["node2"].drained and nodes["node2"].drained_by_sigma and not nodes["node2"].available
    assert nodes["node2"].reason == "sigma: test"
    assert nodes["node1"].available and not nodes["node1"].drained
    assert nodes["node1"].cpus == 2


def test_squeue_running_and_requeued():
    running = Job.from_json(load("squeue.json")["jobs"][-1])
    assert running.state == "RUNNING" and running.nodes == ("node3", "node4") and running.restarts == 0
    requeued = Job.from_json(load("squeue_requeued.json")["jobs"][-1])
    assert requeued.state == "PENDING" and requeued.reason == "BeginTime" and requeued.restarts == 1


def test_sacct_record():
    rec = AccountingRecord.from_json(load("sacct.json")["jobs"][0])
    assert rec.job_id == 2 and rec.state == "REQUEUED" and rec.nodes == ("node3", "node4")
    assert "batch" in rec.steps


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
