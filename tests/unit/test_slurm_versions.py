"""Every Slurm version's recorded answers read into the same typed results.

tests/fixtures/slurm/<major.minor>/ holds what sinfo, scontrol, squeue and sacct printed on real daemons of that
release (recorded by tests/fixtures/slurm/record.py from a fresh 4-node cluster driven through the same steps), in
each state: idle, allocated, drained, down, not responding, reboot requested/issued/done, requeued, finished.
"""

import copy
import json
from functools import cache

import pytest

from sigma.slurm import formats
from sigma.slurm.formats.fields import SlurmFormatError
from tests.conftest import FIXTURES

VERSIONS = sorted(p.parent.name for p in (FIXTURES / "slurm").glob("*/index.json"))
KINDS = {"nodes": ("nodes_argv", "nodes", "node"), "jobs": ("jobs_argv", "jobs", "job"),
         "accounting": ("accounting_argv", "jobs", "run")}


@cache
def index(version):
    return json.loads((FIXTURES / "slurm" / version / "index.json").read_text())


def family(version):
    return formats.family_for(formats.parse_release(index(version)["release"]))


def raw(version, state, kind):
    """The recorded answer of the command this version's family runs for kind, in state: (argv, data)."""
    fam = family(version)
    want = tuple(getattr(fam, KINDS[kind][0]))
    for name, meta in index(version)["files"].items():
        if meta["state"] == state and tuple(meta["argv"][:len(want)]) == want \
                and (kind != "jobs" or tuple(meta["argv"]) == want):
            return meta["argv"], json.loads((FIXTURES / "slurm" / version / name).read_text())
    raise LookupError(f"no {kind} answer recorded for {state} on {version}")


def parse(version, state, kind, data=None):
    fam = family(version)
    argv, recorded = raw(version, state, kind)
    data = recorded if data is None else data
    _, key, method = KINDS[kind]
    records = fam.top(data, fam.source(argv, data), key)
    if kind == "accounting":
        text = FIXTURES / "slurm" / version / f"{state}.sacct_exit_codes.txt"
        assert text.exists() == bool(fam.exit_codes_argv(argv))
        return fam.runs(records, text.read_text() if text.exists() else None)
    return [getattr(fam, method)(r) for r in records]


def nodes(version, state):
    return {n.name: n for n in parse(version, state, "nodes")}


def node_view(version, state):
    return {n.name: (n.state, tuple(sorted(n.flags)), n.reason) for n in parse(version, state, "nodes")}


def test_every_version_recorded():
    assert VERSIONS == ["22.05", "24.11", "26.05"]


@pytest.mark.parametrize("state", ["idle", "allocated", "drained", "down", "not_responding", "reboot_requested",
                                   "reboot_issued", "rebooted"])
def test_nodes_are_the_same_on_every_version(state):
    views = {v: node_view(v, state) for v in VERSIONS}
    assert all(view == views["22.05"] for view in views.values()), views


@pytest.mark.parametrize("version", VERSIONS)
def test_node_states_read_as_sigma_acts_on_them(version):
    idle = nodes(version, "idle")
    assert [n.state for n in idle.values()] == ["idle"] * 4 and all(n.available for n in idle.values())
    assert idle["node1"].cpus == 2 and idle["node1"].partitions == ("debug",)
    assert idle["node1"].boot_time > 1_600_000_000 and idle["node1"].slurmd_start_time >= idle["node1"].boot_time
    assert nodes(version, "allocated")["node1"].alloc_cpus == 1  # one task on each of two nodes
    drained = nodes(version, "drained")
    assert drained["node2"].state == "mixed" and drained["node2"].drained and drained["node2"].drained_by_sigma
    assert drained["node3"].state == "idle" and drained["node3"].drained and not drained["node3"].available
    assert drained["node4"].drained and not drained["node4"].drained_by_sigma and drained["node4"].reason_user
    assert drained["node3"].reason_time > 1_600_000_000
    down = nodes(version, "down")["node4"]
    assert down.state == "down" and not down.responding and down.drained_by_sigma
    silent = nodes(version, "not_responding")["node3"]
    assert silent.silent and not silent.rebooting
    assert nodes(version, "reboot_requested")["node1"].rebooting
    issued = nodes(version, "reboot_issued")["node1"]
    assert issued.rebooting and not issued.silent
    back = nodes(version, "rebooted")["node1"]
    assert back.state == "down" and "reboot complete" in back.reason and not back.rebooting


def job_view(version, state):
    return [(j.job_id, j.name, j.state, j.nodes, j.restarts) for j in parse(version, state, "jobs")]


@pytest.mark.parametrize("state", ["idle", "allocated", "requeue_completing", "requeued", "finished"])
def test_jobs_are_the_same_on_every_version(state):
    views = {v: job_view(v, state) for v in VERSIONS}
    assert all(view == views["22.05"] for view in views.values()), views


@pytest.mark.parametrize("version", VERSIONS)
def test_job_states_through_a_requeue(version):
    (running,) = parse(version, "allocated", "jobs")
    assert running.state == "RUNNING" and running.active and running.nodes == ("node1", "node2")
    assert running.start_time >= running.submit_time > 1_600_000_000 and running.user == "root"
    (completing,) = parse(version, "requeue_completing", "jobs")
    assert completing.state == "COMPLETING" and completing.active and completing.restarts == 1
    (pending,) = parse(version, "requeued", "jobs")
    assert (pending.state, pending.reason, pending.restarts) == ("PENDING", "BeginTime", 1)
    finished = {j.name: j for j in parse(version, "finished", "jobs")}
    assert finished["ok"].state == "COMPLETED" and not finished["ok"].active
    assert finished["bad"].state == "FAILED" and finished["bad"].reason == "NonZeroExitCode"


@pytest.mark.parametrize("version", VERSIONS)
def test_accounting_runs_exit_codes_and_steps(version):
    runs = parse(version, "finished", "accounting")
    by_name = {}
    for r in runs:
        by_name.setdefault(r.name, []).append(r)
    ok, = by_name["ok"]
    assert (ok.state, ok.return_code, ok.exit_status) == ("COMPLETED", 0, "SUCCESS")
    assert sorted(ok.steps) == ["0", "batch"]  # its srun step and the batch script
    assert ok.end_time >= ok.start_time > 0 and ok.elapsed_s >= 0
    killed, = by_name["killed"]
    assert (killed.state, killed.return_code, killed.exit_status, killed.signal) == ("FAILED", None, "SIGNALED", 9)
    bad, = by_name["bad"]
    # 22.05's sacct --json says 0 and SUCCESS here; its text answer (recorded beside it) says 3:0
    assert (bad.state, bad.return_code, bad.exit_status) == ("FAILED", 3, "ERROR")
    sleeper = by_name["sleeper"]
    assert [r.state for r in sleeper] == ["REQUEUED", "CANCELLED"] and sleeper[0].steps == ("batch",)


@pytest.mark.parametrize("version", VERSIONS)
def test_requeued_run_in_accounting(version):
    runs = parse(version, "requeued", "accounting")
    assert runs[0].state == "REQUEUED" and runs[0].nodes == ("node1", "node2") and runs[0].steps == ("batch",)


@pytest.mark.parametrize("version", [v for v in VERSIONS if v != "22.05"])
def test_newer_sinfo_groups_nodes_which_is_why_scontrol_is_asked(version):
    data = json.loads((FIXTURES / "slurm" / version / "idle.sinfo.json").read_text())
    assert "nodes" not in data and isinstance(data["sinfo"], list)
    assert family(version).nodes_argv == ("scontrol", "show", "nodes", "--json")


@pytest.mark.parametrize("version", VERSIONS)
def test_unknown_field_shape_is_one_clear_error(version):
    argv, data = raw(version, "drained", "nodes")
    broken = copy.deepcopy(data)
    broken["nodes"][2]["state"] = {"base": "IDLE"}
    with pytest.raises(SlurmFormatError) as err:
        parse(version, "drained", "nodes", broken)
    message = str(err.value)
    assert index(version)["release"] in message and " ".join(argv) in message and "$.nodes[2].state" in message
    broken = copy.deepcopy(data)
    del broken["nodes"][0]["name"]
    with pytest.raises(SlurmFormatError, match=r"\$\.nodes\[0\]\.name missing"):
        parse(version, "drained", "nodes", broken)


def test_a_parser_of_another_family_is_refused():
    argv, data = raw("26.05", "idle", "nodes")
    with pytest.raises(SlurmFormatError, match="data_parser/v0.0.45"):
        family("22.05").source(argv, data)
    data = copy.deepcopy(data)
    data["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.47"
    with pytest.raises(SlurmFormatError, match="v0.0.47"):
        family("26.05").source(argv, data)


@pytest.mark.parametrize("text,known", [("slurm 22.05.8", True), ("slurm-wlm 24.11.5", True), ("slurm 26.05.5", True),
                                        ("slurm 21.08.8", False), ("slurm 27.05.0", False)])
def test_releases_sigma_knows(text, known):
    release = formats.parse_release(text)
    if known:
        assert formats.family_for(release).release == text.split()[-1]
    else:
        with pytest.raises(SlurmFormatError, match=f"{release[0]}.{release[1]:02d}.{release[2]}.*does not know"):
            formats.family_for(release)


def test_22_05_exit_codes_come_from_its_text_answer_run_by_run():
    fam = family("22.05")
    argv, data = raw("22.05", "finished", "accounting")
    assert fam.exit_codes_argv(argv)[-2:] == ["-o", "JobIDRaw,ExitCode"] and "--json" not in fam.exit_codes_argv(argv)
    records = fam.top(data, fam.source(argv, data), "jobs")
    text = (FIXTURES / "slurm" / "22.05" / "finished.sacct_exit_codes.txt").read_text()
    # a run the text answer does not have yet (added between the two queries) keeps the JSON's code
    missing_last = "\n".join(line for line in text.splitlines() if not line.startswith("4|"))
    assert {r.name: r.return_code for r in fam.runs(records, missing_last)}["bad"] == 0
    with pytest.raises(SlurmFormatError, match="JOBID|RC:SIGNAL"):
        fam.runs(records, text.replace("3:0", "three"))
