"""Pure check functions on fact dicts, and each check run against the fixture trees."""

import pytest

from sigma.health.checks import accelerators, disk, free_memory, infiniband, mounts, net_interfaces, page_cache
from sigma.health.checks.accelerators import GpuFacts, NvmlFacts, check_accelerators
from sigma.health.facts import Proc
from sigma.health.checks.stray_processes import check_stray_processes, find_strays
from sigma.health.checks.gemm_sustained import check_gemm_sustained
from sigma.health.checks.collective import check_collective, plan
from tests.unit.health_helpers import context, tree


def healthy_gpu(i):
    return GpuFacts(i, "NVIDIA H100 80GB HBM3", f"0000:{i:02x}:00.0", 0, False, False, False, 0, True, 40.0)


# ---------- accelerators ----------
def test_accelerators_skip_without_nvml_unless_expected():
    nv = NvmlFacts(False, "NVML Shared Library Not Found")
    assert check_accelerators(nv, None).status == "skip"
    r = check_accelerators(nv, 8)
    assert r.status == "fail" and "expected 8 GPUs" in r.message


def test_accelerators_healthy_and_count_mismatch():
    nv = NvmlFacts(True, driver="535.129", gpus=[healthy_gpu(i) for i in range(8)])
    assert check_accelerators(nv, 8).status == "pass"
    r = check_accelerators(NvmlFacts(True, gpus=nv.gpus[:7]), 8)
    assert r.status == "fail" and "7 GPUs visible, expected 8" in r.message and r.category == "gpu"


@pytest.mark.parametrize("change, category, words", [
    (dict(ecc_uncorrected=3), "gpu-memory", "3 uncorrectable ECC"),
    (dict(remap_failure=True), "gpu-memory", "row remapping failure"),
    (dict(retired_pending=True), "gpu-memory", "needs a GPU reset"),
    (dict(xids=[79]), "gpu", "pending Xid 79"),
    (dict(throttle_reasons=0x40 | 0x1), "gpu", "hw_thermal"),
    (dict(persistence=False), "gpu", "persistence mode off"),
    (dict(temperature_c=93.0), "gpu", "temperature 93 C"),
])
def test_accelerators_faults(change, category, words):
    gpus = [healthy_gpu(i) for i in range(2)]
    for k, v in change.items():
        setattr(gpus[1], k, v)
    r = check_accelerators(NvmlFacts(True, gpus=gpus), 2)
    assert r.status == "fail" and r.category == category and words in r.message and "GPU1" in r.message


def test_idle_throttle_is_not_a_fault():
    gpus = [healthy_gpu(0)]
    gpus[0].throttle_reasons = 0x1  # GPU idle
    assert check_accelerators(NvmlFacts(True, gpus=gpus), 1).status == "pass"


def test_accelerators_run_on_this_host_has_no_nvml_and_expectation_decides(tmp_path):
    root = tree(tmp_path, "healthy")
    assert accelerators.run(context(root, "other", tmp_path / "n"), {}).status == "skip"
    assert accelerators.run(context(root, "gpu01", tmp_path / "n"), {}).status == "fail"


# ---------- host facts through the fixture root ----------
def test_healthy_tree_passes_host_checks(tmp_path):
    ctx = context(tree(tmp_path, "healthy"), "gpu01", tmp_path / "node")
    for module in (free_memory, disk, mounts, net_interfaces, infiniband, page_cache):
        r = module.run(ctx, {})
        assert r.status == "pass", (module.__name__, r.message)


def test_faulty_tree_fails_each_host_check_with_its_reason(tmp_path):
    root = tree(tmp_path, "faulty")
    (root / "scratch" / ".keep").unlink()
    (root / "scratch").rmdir()
    ctx = context(root, "gpu02", tmp_path / "node")
    expect = {free_memory: "of memory available", disk: "/scratch missing", mounts: "not mounted: /scratch",
              net_interfaces: "down: eth0 (down), ib0 (down)", infiniband: "mlx5_1/1 state=1: DOWN phys=2: Polling",
              page_cache: "page cache holds"}
    for module, words in expect.items():
        r = module.run(ctx, {"max_fraction": 0.5})
        assert r.status == "fail" and words in r.message, (module.__name__, r.message)


def test_disk_not_writable_missing_and_full(tmp_path):
    facts = disk.gather(tmp_path, 0.0, True)
    assert facts.exists and facts.write_error == "" and disk.check_disk([facts]).status == "pass"
    assert "missing" in disk.check_disk([disk.gather(tmp_path / "nope", 0.0, True)]).message
    r = disk.check_disk([disk.PathFacts("/scratch", True, 10.0, "Read-only file system", 0.0)])
    assert r.status == "fail" and "/scratch not writable (Read-only file system)" in r.message
    r = disk.check_disk([disk.PathFacts("/scratch", True, 10.0, "", 50.0)])
    assert r.status == "fail" and "10.0 GiB free < 50.0 GiB" in r.message


def test_ib_expected_but_absent_and_absent_unexpected():
    assert infiniband.check_infiniband(None, None).status == "skip"
    assert infiniband.check_infiniband(None, 8).status == "fail"
    ports = [{"device": "mlx5_0", "port": "1", "state": "4: ACTIVE", "phys_state": "5: LinkUp"}]
    r = infiniband.check_infiniband(ports, 2)
    assert r.status == "fail" and "expected 2" in r.message


def test_interfaces_any_up_when_none_required():
    ifs = {"lo": {"operstate": "unknown", "carrier": "1"}, "eth0": {"operstate": "down", "carrier": "0"}}
    assert net_interfaces.check_net_interfaces(ifs, []).status == "fail"
    ifs["eth1"] = {"operstate": "up", "carrier": "1"}
    assert net_interfaces.check_net_interfaces(ifs, []).status == "pass"


def test_free_memory_thresholds():
    mi = {"MemTotal": 100 << 20, "MemAvailable": 4 << 20}
    assert free_memory.check_free_memory(mi, 0.05).status == "fail"
    assert free_memory.check_free_memory(mi, 0.03).status == "pass"
    assert free_memory.check_free_memory(mi, 0.03, min_available_gb=8).status == "fail"


# ---------- processes ----------
def proc(pid, job, node="node1", script=False):
    env = {"SLURM_JOB_ID": str(job), "SLURMD_NODENAME": node}
    if script:
        env["SLURM_SCRIPT_CONTEXT"] = "prolog_slurmd"
    return Proc(pid, 1, 1000, "python", "python train.py", env)


def test_find_strays_ignores_running_current_other_nodes_and_hooks():
    procs = [proc(10, 5), proc(11, 6), proc(12, 7, node="node2"), proc(13, 8), proc(14, 9, script=True),
             Proc(15, 1, 0, "sshd", "sshd", {})]
    strays = find_strays(procs, "node1", active_jobs={6}, current_job=8)
    assert [p.pid for p in strays] == [10]


def test_find_strays_only_of_this_clusters_jobs():
    mine, theirs = proc(10, 5), proc(11, 5)
    mine.env["SLURM_CONF"], theirs.env["SLURM_CONF"] = "/a/slurm.conf", "/b/slurm.conf"
    strays = find_strays([mine, theirs], "node1", active_jobs=set(), current_job=None, slurm_conf="/a/slurm.conf")
    assert [p.pid for p in strays] == [10]


def test_stray_result_reports_survivors_only():
    strays = [proc(10, 5), proc(11, 5)]
    assert check_stray_processes(strays).status == "fail"
    assert check_stray_processes(strays, survivors=[]).status == "pass"
    r = check_stray_processes(strays, survivors=strays[1:])
    assert r.status == "fail" and "11:python(job 5)" in r.message


# ---------- comprehensive pure parts ----------
def test_gemm_sustained_detects_corruption_and_sag():
    assert check_gemm_sustained([10.0, 9.8, 10.1, 9.9], 0, 0.3).status == "pass"
    r = check_gemm_sustained([10.0, 9.8, 10.1], 2, 0.3)
    assert r.status == "fail" and "silent data corruption" in r.message
    r = check_gemm_sustained([10.0, 4.0, 4.1, 3.9], 0, 0.3)
    assert r.status == "fail" and r.category == "performance"


def test_collective_plan_and_result_check():
    assert plan(0, 2) == ("gloo", 2)
    assert plan(1, 2) == ("gloo", 2)
    assert plan(8, 0) == ("nccl", 8)
    assert plan(8, 4) == ("nccl", 4)
    missing = check_collective([{"rank": 0, "correct": True}], 2, "gloo")
    assert (missing.status, missing.category, missing.message) == ("error", "tool", "1 of 2 ranks reported")
    wrong = check_collective([{"rank": 0, "correct": True}, {"rank": 1, "correct": False}], 2, "gloo")
    assert wrong.status == "fail" and wrong.category == "host-memory" and "ranks [1]" in wrong.message
    assert check_collective([{"rank": 0, "correct": True}, {"rank": 1, "correct": False}], 2, "nccl").category == \
        "nvlink"
    assert check_collective([{"rank": 0, "correct": True}, {"rank": 1, "correct": True}], 2, "gloo") is None


def test_collective_ranks_late_or_failing_blame_no_part(tmp_path):
    """Real rank processes: late ones are a timeout and failing ones an error (the hook's tool_failure policy
    decides), never a failed host memory that drains the node."""
    from sigma.health.checks import collective

    ctx = context(tree(tmp_path, "healthy"), "node1", tmp_path / "nd")
    late = collective.run(ctx, {"ranks": 2, "worker_timeout_s": 0.01})  # torch alone takes longer to import
    assert late.status == "timeout" and late.category is None and "did not finish within 0.01s" in late.message
    broken = collective.run(ctx, {"ranks": 2, "iters": "ten", "worker_timeout_s": 60})  # refused by the rank
    assert broken.status == "error" and broken.category == "tool" and "gloo all_reduce with 2 ranks failed" in \
        broken.message
