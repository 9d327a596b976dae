"""Shared fixtures: the real local SLURM cluster, started once per test session."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHARED_DATA = Path(os.environ.get("SIGMA_DATA") or REPO.parent / "shared" / "data")  # $SIGMA_DATA: elsewhere


def load_bench(name: str):
    """bench/NAME.py as a module (the benches are scripts, not a package), registered as bench_NAME."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def wait_for(predicate, timeout=60.0, interval=0.3, what="condition"):
    """Poll predicate until it returns something truthy (returned); fail the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _test_cluster_location() -> tuple[Path, int]:
    """One cluster per checkout, on its own ports, so several checkouts can test side by side."""
    digest = int(hashlib.sha1(str(REPO).encode()).hexdigest()[:8], 16)
    state = Path(os.environ.get("SIGMA_TEST_CLUSTER_DIR", f"/tmp/sigma-test-cluster-{digest:08x}"))
    # the same checkout's tests on another Slurm (make test-slurm-versions) run beside it on ports of their own
    offset = int(os.environ.get("SIGMA_TEST_PORT_OFFSET") or 0)
    return state, 20000 + (digest % 400) * 25 + offset


@pytest.fixture(scope="session")
def cluster():
    from sigma.slurm.client import Slurm
    from sigma.slurm.cluster import ClusterError, ClusterSpec, LocalCluster

    state, port_base = _test_cluster_location()
    local = LocalCluster(state)
    local.down(keep_munge=True)  # a fresh start picks up config changes
    try:
        try:
            local.up(ClusterSpec(nodes=4, port_base=port_base))
        except ClusterError:
            # slurmctld restored what a killed test session left in its saved state (a running job, a node down):
            # cancel and resume as after every test, then go on
            reset_cluster(Slurm(local.conf), local, timeout=120)
    except BaseException:  # whatever failed (a traceback, Ctrl-C), no daemon of ours outlives the session
        local.down(keep_munge=True)
        raise
    yield local
    local.down(keep_munge=True)


@pytest.fixture
def slurm(cluster, tmp_path_factory):
    """A client for the test cluster; afterwards jobs are cancelled and every node returned to service."""
    from sigma.slurm.client import Slurm

    client = Slurm(cluster.conf)
    # Jobs submitted without --output write their log here, not into the checkout.
    client.env["SBATCH_OUTPUT"] = str(tmp_path_factory.getbasetemp() / "slurm-%j.out")
    yield client
    reset_cluster(client, cluster)


def reset_cluster(client, cluster, timeout: float = 60.0) -> None:
    from sigma.slurm.command import SlurmError

    for job in client.jobs():
        if job.active:
            client.cancel(job.job_id)
    for name in client.reservations():
        client.delete_reservation(name)
    for node in cluster.node_names():
        cluster.kernel_log(node).write_text("")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = client.nodes()
        stuck = [n.name for n in nodes if not n.available or n.state not in ("idle",)]
        if not stuck and not any(j.active for j in client.jobs()):
            return
        try:
            client.resume([n.name for n in nodes if n.drained or n.state == "down"], force=True)
        except (SlurmError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"cluster did not return to idle: {[(n.name, n.state, n.flags) for n in client.nodes()]}")


@pytest.fixture(scope="session")
def train_data(tmp_path_factory):
    """Token shards of a small slice of the Python standard library (BPE with the debug preset's 512 tokens)."""
    from sigma.train.data import prepare

    out = tmp_path_factory.mktemp("train-data")
    prepare(out, max_mb=0.5, shard_tokens=100_000, vocab_size=512)
    return out


@pytest.fixture
def jd(tmp_path):
    """A private journald of this boot (its first kernel line written), or the test skipped where none can run."""
    from tests import journald

    why = journald.available()
    if why:
        pytest.skip(why)
    with journald.Journald(tmp_path / "jd") as j:
        j.kernel("Linux version 6.1.0 (boot line of this boot)", level=5)
        j.sync()
        yield j
