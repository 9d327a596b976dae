"""sigma simulate: bad input named by row, model fits, and the controller's real decisions on a virtual clock."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sigma.cli import build_parser, main
from sigma.simulate.fit import fit, fit_systems, ks
from sigma.simulate.runner import simulate
from sigma.simulate.trace import BadRows, TraceError, read_lanl
from tests.conftest import SHARED_DATA

LANL = SHARED_DATA / "lanl" / "failures-systems-2-10.csv"
T0 = "2026-01-01T00:00:00"


def args(*extra):
    return build_parser().parse_args(["simulate", "--compare", "manual", *extra])


def trace(tmp_path, *rows, name="trace.csv"):
    path = tmp_path / name
    path.write_text("node,start,end,kind\n" + "".join(r + "\n" for r in rows))
    return str(path)


# ---------- bad input ----------
@pytest.mark.parametrize("row, message", [
    ("node0001,,2026-01-01T02:00,memory", "trace.csv:2: missing start"),
    ("node0001,2026-01-01T02:00,2026-01-01T01:00,memory", "trace.csv:2: outage ends before it starts"),
    ("node0099,2026-01-01T01:00,2026-01-01T02:00,memory", "trace.csv:2: unknown node 'node0099'"),
    ("node0001,2026-01-01T01:00,2026-01-01T02:00,gremlins", "trace.csv:2: unknown fault kind 'gremlins'"),
    ("node0001,yesterday,2026-01-01T02:00,memory", "trace.csv:2: start 'yesterday' is neither"),
])
def test_bad_trace_rows_are_named(tmp_path, row, message):
    with pytest.raises(TraceError, match=message.replace("(", r"\(")):
        simulate(args("--nodes", "4", "--days", "1", "--failures", trace(tmp_path, row)))


def test_overlapping_outages_name_both_rows_or_merge_when_asked(tmp_path):
    path = trace(tmp_path, "node0001,2026-01-01T01:00,2026-01-01T03:00,memory",
                 "node0002,2026-01-01T01:30,2026-01-01T02:00,memory",
                 "node0001,2026-01-01T02:00,2026-01-01T04:00,network")
    with pytest.raises(TraceError, match=r"trace.csv:4: outage of node 0 .* overlaps the one at .*trace.csv:2"):
        simulate(args("--nodes", "4", "--days", "1", "--failures", path))
    out = simulate(args("--nodes", "4", "--days", "1", "--failures", path, "--overlaps", "merge"))
    assert out["outages_in_period"] == 2 and "trace.csv:4" in out["notes"][0]


def test_impossible_workload_names_the_row(tmp_path):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("name,nodes,count\nsmall,2,1\nhuge,64,1\n")
    with pytest.raises(TraceError, match=r"jobs.csv:3: job 'huge' needs 64 nodes; the cluster has 8"):
        simulate(args("--nodes", "8", "--days", "1", "--jobs", str(jobs)))
    jobs.write_text("name,nodes,count,colour\nx,2,1,red\n")
    with pytest.raises(TraceError, match=r"jobs.csv:1: unknown columns \['colour'\]"):
        simulate(args("--nodes", "8", "--days", "1", "--jobs", str(jobs)))


def test_bad_input_is_a_clean_cli_error(tmp_path, capsys):
    rc = main(["simulate", "--nodes", "4", "--days", "1", "--failures",
               trace(tmp_path, "node0009,2026-01-01T01:00,2026-01-01T02:00,memory")])
    assert rc == 2 and "trace.csv:2: unknown node 'node0009'" in capsys.readouterr().err


def test_replay_on_a_cluster_too_small_names_the_row():
    if not LANL.exists():
        pytest.skip("shared LANL data not present")
    with pytest.raises(TraceError, match=r"failures-systems-2-10.csv:\d+: node \d+ does not exist in a cluster of 16"):
        simulate(args("--nodes", "16", "--days", "1", "--failures", "replay:9", "--overlaps", "merge"))


# ---------- fits ----------
@pytest.mark.parametrize("family, a, b", [("weibull", 0.7, 300.0), ("lognormal", 0.5, 1.4)])
def test_maximum_likelihood_recovers_known_parameters(family, a, b):
    rng = np.random.default_rng(3)
    x = b * rng.weibull(a, 20000) if family == "weibull" else rng.lognormal(a, b, 20000)
    d = fit(x, family)
    assert d.a == pytest.approx(a, rel=0.03) and d.b == pytest.approx(b, rel=0.03)
    assert ks(d, x) < 0.02
    other = fit(x, "lognormal" if family == "weibull" else "weibull")
    assert d.aic < other.aic  # the right family wins


def test_lanl_fits_per_system_pooled_and_held_out():
    if not LANL.exists():
        pytest.skip("shared LANL data not present")
    out = fit_systems(read_lanl(LANL), [3, 4, 9, 10])
    assert set(out["systems"]) == {2, 3, 4, 5, 6, 7, 8, 9, 10}
    assert out["pooled"]["uptime_h"]["family"] in ("weibull", "lognormal")
    for system, row in out["held_out"].items():  # a fit on the other systems, scored on this one
        for family in ("weibull", "lognormal"):
            check = row["uptime_h"][family]
            assert 0 < check["own"] <= check["others_shape"] + 0.2, (system, family, check)


# ---------- the controller's own decisions ----------
def test_xid_is_drained_by_the_real_rule_rebooted_validated_and_resumed(tmp_path):
    path = trace(tmp_path, "node0001,2026-01-01T06:00:00,,xid")
    db = tmp_path / "sim.db"
    out = simulate(args("--nodes", "8", "--days", "1", "--failures", path, "--db", str(db)))
    policy, manual = out["arms"]["policy"], out["arms"]["manual"]
    assert policy["incidents"] == {"gpu-xid-79 resolved": 1}
    assert policy["automation"] == {"automatic": 1, "manual": 0, "ratio": 1.0}
    assert policy["job_interruptions"] == 1 == manual["job_interruptions"]
    # detected within the soak's Xid range; recovered faster than a person can
    assert 1.0 <= policy["node_recycle_s"]["detect"]["median"] <= 1.8
    assert policy["job_recovery_s"]["median"] < manual["job_recovery_s"]["median"]
    import sqlite3

    conn = sqlite3.connect(db)
    kinds = [r[0] for r in conn.execute("SELECT kind FROM actions WHERE state = 'done' ORDER BY id")]
    assert kinds[:3] == ["drain", "requeue", "start_now"] and "reboot" in kinds and "submit_validation" in kinds
    states = [r[0] for r in conn.execute("SELECT to_state FROM lifecycle_transitions ORDER BY id")]
    assert states == ["drained", "waiting_jobs", "remediating", "validating", "resumed"]


def test_dead_node_waits_for_the_admin_and_counts_as_manual(tmp_path):
    path = trace(tmp_path, "node0002,2026-01-01T03:00:00,2026-01-01T07:00:00,node-death")
    db = tmp_path / "sim.db"
    out = simulate(args("--nodes", "8", "--days", "1", "--failures", path, "--db", str(db)))
    policy = out["arms"]["policy"]
    assert policy["incidents"] == {"slurm-node-not-responding resolved": 1}
    assert policy["automation"]["manual"] == 1  # the manual playbook: a person repaired it
    assert policy["node_recycle_s"]["repair"]["median"] >= 3.5 * 3600
    import sqlite3

    conn = sqlite3.connect(db)
    kinds = [r[0] for r in conn.execute("SELECT kind FROM actions WHERE state = 'done' ORDER BY id")]
    assert kinds[:4] == ["drain", "requeue", "start_now", "set_down"]  # DOWN once its job was requeued


def test_circuit_breaker_escalates_a_wave_to_people(tmp_path):
    rows = [f"node{i:04d},2026-01-01T05:00:{i:02d},,xid" for i in range(1, 13)]
    out = simulate(args("--nodes", "16", "--days", "1", "--failures", trace(tmp_path, *rows)))
    policy = out["arms"]["policy"]
    assert policy["incidents"]["gpu-xid-79 resolved"] == 4  # max_fraction 0.25 of 16 nodes
    assert policy["escalations"] >= 8 and policy["incidents"]["gpu-xid-79 escalated"] >= 8


def test_bare_command_runs_and_writes_json_and_plots(tmp_path, capsys):
    if not LANL.exists():
        pytest.skip("shared LANL data not present")
    assert main(["simulate", "--nodes", "16", "--days", "2", "--json", "--plots", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    out = json.loads(text[:text.rindex("}") + 1])
    assert out["model"]["uptime_h"]["family"] in ("weibull", "lognormal")
    assert set(out["arms"]) == {"policy", "manual"}
    for arm in out["arms"].values():
        assert 0 <= arm["utilisation"]["effective"] <= arm["utilisation"]["allocated"] <= 1
    assert (tmp_path / "utilisation.png").stat().st_size > 1000 and (tmp_path / "recovery.png").exists()


def test_bad_lanl_rows_are_named(tmp_path):
    head = "System,nodes,nodenumz,Prob Started,Prob Fixed,Down Time,Hardware,Software\n"
    path = tmp_path / "lanl.csv"
    path.write_text(head + "20,4,1,6/21/2005 10:54,6/21/2005 11:00,6,CPU,\n20,4,2,6/22/2005 10:54,,,,OS\n")
    with pytest.raises(TraceError, match=r"lanl.csv:3: missing Prob Fixed"):
        read_lanl(path)
    path.write_text(head + "20,4,1,6/21/2005 10:54,6/21/2005 09:00,6,CPU,\n")
    with pytest.raises(TraceError, match=r"lanl.csv:2: outage ends before it starts"):
        simulate(args("--nodes", "4", "--days", "1", "--failures", str(path), "--system", "20"))


def test_node_mtbf_keeps_the_fitted_shape_at_the_sites_rate():
    if not LANL.exists():
        pytest.skip("shared LANL data not present")
    fitted = simulate(args("--nodes", "4", "--days", "1", "--compare", "none"))["model"]["uptime_h"]
    scaled = simulate(args("--nodes", "4", "--days", "1", "--compare", "none", "--node-mtbf-h", "100"))["model"]
    assert scaled["uptime_h"]["mean"] == pytest.approx(100.0, rel=1e-3)
    assert scaled["uptime_h"]["family"] == fitted["family"]
    assert scaled["uptime_h"].get("shape", scaled["uptime_h"].get("sigma")) == \
        fitted.get("shape", fitted.get("sigma"))


def test_hang_and_straggler_are_isolated_and_verified(tmp_path):
    path = trace(tmp_path, "node0001,2026-01-01T06:00:00,,hang", "node0006,2026-01-01T09:00:00,,straggler")
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("name,nodes,count,restart_min\ntrain,4,1,1\n")
    out = simulate(args("--nodes", "8", "--days", "1", "--failures", path, "--jobs", str(jobs)))
    policy = out["arms"]["policy"]
    # the job's first steps after its restart (within verify_after_s) confirm both decisions
    assert policy["incidents"] == {"isolation-outlier confirmed": 1, "watchdog-hang confirmed": 1}


def test_isolation_waits_for_a_restart_longer_than_verify_after_s(tmp_path):
    """A 10-minute restart reaches its first step after the shipped verify_after_s (600 s) from the decision: the
    verification counts from the job's restart, so the decision is confirmed and the node repaired (counted from the
    decision it was misdiagnosed and the faulty node sent back)."""
    path = trace(tmp_path, "node0001,2026-01-01T06:00:00,,hang")
    out = simulate(args("--nodes", "8", "--days", "0.5", "--failures", path, "--compare", "none"))
    assert out["arms"]["policy"]["incidents"] == {"watchdog-hang confirmed": 1}


# ---------- real files as published ----------
LANL_HEAD = ("System,machine type,nodes,procstot,procsinnode,nodenum,nodenumz,node install,node prod,node decom,"
             "fru type,mem,cputype,memtype,num intercon,purpose,Prob Started,Prob Fixed,Down Time,Facilities,"
             "Hardware,Human Error,Network,Undetermined,Software,Same Event\n")


def lanl_row(system, node, start, end, hardware="", software=""):
    return (f"{system},cluster,4,16,4,{node},{node},,,,,,,,,compute,{start},{end},10,,{hardware},,,,{software},No\n")


def test_lanl_file_with_every_system_reads_only_the_chosen_one(tmp_path):
    """System 17 of the published file has no node numbers: its rows are never judged when another is chosen."""
    path = tmp_path / "all.csv"
    path.write_text(LANL_HEAD + lanl_row(20, 1, "6/21/2005 10:54", "6/21/2005 11:00", hardware="CPU")
                    + "17,,,,,,,,,,,,,,,,1/8/1997 8:40,1/8/1997 8:50,10,,Other,,,,,No\n"
                    + lanl_row(20, 2, "6/22/2005 10:54", "6/22/2005 12:00", software="OS"))
    assert [o.node for o in read_lanl(path, 20)[20]] == [1, 2]
    with pytest.raises(TraceError, match=r"all.csv:3: nodenumz '' is not a node number \(system 17\)"):
        read_lanl(path)
    bad = BadRows(skip=True)
    assert sorted(read_lanl(path, None, bad)) == [20] and bad.skipped == [
        f"{path}:3: nodenumz '' is not a node number (system 17)"]
    out = simulate(args("--nodes", "4", "--days", "2", "--failures", str(path), "--system", "20"))
    assert out["outages_in_period"] == 2


def test_skip_bad_says_how_many_rows_it_skipped(tmp_path):
    path = trace(tmp_path, "node0001,2026-01-01T01:00,2026-01-01T02:00,memory", "node0099,2026-01-01T01:00,,xid",
                 "node0002,soon,,xid", "node0003,2026-01-01T03:00,2026-01-01T04:00,network")
    with pytest.raises(TraceError, match=r"trace.csv:3: unknown node 'node0099'.*--skip-bad"):
        simulate(args("--nodes", "4", "--days", "1", "--failures", path))
    out = simulate(args("--nodes", "4", "--days", "1", "--failures", path, "--skip-bad"))
    assert out["outages_in_period"] == 2
    assert out["notes"][0].startswith("skipped 2 unusable rows (--skip-bad): ") and "trace.csv:4: start 'soon'" \
        in out["notes"][0]


def hbd(tmp_path, *events, name="fault_trace.json"):
    """An InfiniteHBD fault_trace.json, pretty-printed as published (one field a line)."""
    path = tmp_path / name
    path.write_text(json.dumps([{"node_id": n, "event_time": t, "event_type": e,
                                 "fault_type": {"Level": lvl, "Class": c, "Desc": d}}
                                for n, t, e, (lvl, c, d) in events], indent=4))
    return str(path)


DBE = ("Hardware Failure", "GPU", "GPU DBE(Double Bit ECC) > Threshold")
FAN = ("Hardware Failure", "Fan", "Speed Critical (Sensor)")


def test_infinitehbd_trace_as_published(tmp_path):
    from sigma.simulate import infinitehbd

    path = hbd(tmp_path, ("a-1", 0.25, "fault_start", DBE), ("b-2", 0.5, "fault_start", FAN),
               ("a-1", 0.75, "fault_end", DBE), ("b-2", 1.0, "fault_end", FAN))
    outages, ids = infinitehbd.read(path)
    assert ids == ["a-1", "b-2"] and [(o.node, o.kind, o.repair_s) for o in outages] == [
        (0, "gpu-memory", 43200.0), (1, "people", 43200.0)]
    assert outages[0].start == infinitehbd.DAY0 + 6 * 3600 and outages[0].detail == DBE[1] + ": " + DBE[2]
    # each bad record is named by the line it starts on (10 lines a record as published)
    path = hbd(tmp_path, ("a-1", 0.25, "fault_start", DBE), ("a-1", 0.75, "fault_end", FAN),
               ("c-3", 0.8, "fault_start", ("Hardware Failure", "GPU", "Gremlins")), name="bad.json")
    with pytest.raises(TraceError, match=r"bad.json:22: fault_type \{.*'Gremlins'\} is not one this reader knows"):
        infinitehbd.read(path)
    with pytest.raises(TraceError, match=r"the trace has 2 nodes; the cluster has 1"):
        simulate(args("--nodes", "1", "--days", "1", "--failures", hbd(tmp_path, *(
            (n, t, e, DBE) for n, t, e in (("a", 0.1, "fault_start"), ("b", 0.2, "fault_start"))), name="two.json")))
    with pytest.raises(TraceError, match=r"end.json:2: fault_end of node z without a fault_start before it"):
        infinitehbd.read(hbd(tmp_path, ("z", 0.1, "fault_end", DBE), name="end.json"))


def test_a_gpu_past_its_limit_is_reset_once_then_repaired_by_hand_in_both_arms(tmp_path):
    """The trace's recorded repair time is the repair by hand; the policy resets first (NVIDIA's first step for Xid
    48/64), the reset does not fix it and the node goes to people; the person does the same."""
    path = hbd(tmp_path, ("gpu-1", 0.25, "fault_start", DBE), ("gpu-1", 0.5, "fault_end", DBE))
    out = simulate(args("--nodes", "8", "--days", "2", "--failures", path, "--timelines", "1"))
    policy, manual = out["arms"]["policy"], out["arms"]["manual"]
    assert policy["incidents"] == {"gpu-xid-repair resolved": 1} and policy["escalations"] == 0
    (t,) = policy["timelines"]
    steps = [text for _, text in t["events"]]
    assert any("does not fix it" in x for x in steps) and any("with playbook manual" in x for x in steps)
    assert sum("reboot starts" in x for x in steps) == 1 and steps[-1].startswith("controller: RESUMED")
    # both arms: the recorded 6 h by hand, plus what each added; the policy detects in seconds, people in minutes
    for arm in (policy, manual):
        assert 6 * 3600 < arm["fault_out_of_service_s"]["median"] < 8 * 3600
    assert policy["fault_detect_s"]["median"] < 2 < manual["fault_detect_s"]["median"]
    (m,) = manual["timelines"]
    assert any("after a reboot that did not fix it" in text for _, text in m["events"])


def test_a_fault_on_a_node_already_out_keeps_its_repair(tmp_path):
    """The second fault arrives while people still repair the first: the node stays out until the second's
    recorded repair ends, in both arms (it used to vanish when the person was slower than the trace)."""
    path = trace(tmp_path, "node0001,2026-01-01T01:00,2026-01-01T01:10,network",
                 "node0001,2026-01-01T01:12,2026-01-01T20:00,memory")
    out = simulate(args("--nodes", "8", "--days", "1", "--failures", path, "--timelines", "1"))
    assert out["arms"]["manual"]["faults_on_nodes_already_out"] == 1  # the person is still at the node
    for arm in out["arms"].values():
        (t,) = arm["timelines"]
        assert t["back"] and t["out_s"] >= 18.8 * 3600


def test_a_fault_only_a_job_shows_waits_unseen_on_an_idle_node(tmp_path):
    """A slow part on a spare: nobody, person or controller, sees it until a job lands there; detection and time
    out of service count from then, the wait is latent."""
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("name,nodes,count,hours,restart_min,submit_h\nfirst,4,1,,1,0\nlater,4,1,,1,5\n")
    path = trace(tmp_path, "node0008,2026-01-01T01:00,2026-01-01T09:00,slow-part",
                 "node0009,2026-01-01T00:30,2026-01-01T00:40,memory")  # node0009 only starts the clock early
    out = simulate(args("--nodes", "9", "--days", "1", "--failures", path, "--jobs", str(jobs), "--overlaps", "merge",
                        "--timelines", "2"))
    for arm in out["arms"].values():
        t = next(t for t in arm["timelines"] if t["node"] == "node0008")
        assert t["latent_s"] == pytest.approx(4.5 * 3600, abs=60)  # until the second job lands at 05:30
        assert any("the fault shows" in text for _, text in t["events"])
    assert out["arms"]["policy"]["fault_detect_s"]["max"] < 120 < out["arms"]["manual"]["fault_detect_s"]["max"]


def test_cross_fleet_fit_both_ways(tmp_path, capsys):
    if not LANL.exists():
        pytest.skip("shared LANL data not present")
    rng = np.random.default_rng(1)
    events, t = [], {}
    for i in range(200):  # a small fleet of its own: 20 servers, Weibull uptimes, lognormal repairs
        n = f"s{i % 20}"
        start = t.get(n, 0.0) + float(rng.weibull(0.6) * 20.0)
        end = start + float(rng.lognormal(-1.0, 1.0))
        t[n] = end
        events += [(n, start, "fault_start", DBE), (n, end, "fault_end", DBE)]
    path = hbd(tmp_path, *sorted(events, key=lambda e: e[1]))
    assert main(["simulate", "--fit", "--failures", path]) == 0
    out = json.loads(capsys.readouterr().out)["across_fleets"]
    assert out["infinitehbd"]["outages"] == 200
    for way in (out["lanl_to_infinitehbd"], *out["infinitehbd_to_lanl"]["uptime_h"].values()):
        row = way["uptime_h"] if "uptime_h" in way else way
        for family in ("weibull", "lognormal"):
            assert 0 < row[family]["own"] <= row[family]["others"] + 1e-9


def test_node_counts_kept_up_to_date_match_a_recount(tmp_path, monkeypatch):
    """SimSlurm keeps the nodes in service, running jobs and free as they change (a fleet's year recounted them at
    every event); at every step of a run with reboots, reservations, dead nodes and people they equal a recount."""
    from sigma.simulate import engine

    checked = []
    account = engine.Engine._account

    def recounted(self, t):
        s = self.slurm
        outside = [n for n in s.node_map.values() if n.name not in s.reserved]
        assert (s.available, s.allocated) == (sum(n.available for n in outside),
                                              sum(bool(n.alloc_cpus) for n in outside))
        assert s.free == {n.name for n in s.node_map.values() if n.available and not n.alloc_cpus}
        checked.append(t)
        return account(self, t)

    monkeypatch.setattr(engine.Engine, "_account", recounted)
    path = trace(tmp_path, "node0001,2026-01-01T01:00,,xid", "node0002,2026-01-01T02:00,2026-01-01T05:00,node-death",
                 "node0003,2026-01-01T03:00,2026-01-01T04:00,memory", "node0004,2026-01-01T03:30,,hang",
                 "node0005,2026-01-01T04:00,2026-01-01T09:00,people")
    simulate(args("--nodes", "8", "--days", "1", "--failures", path))
    assert len(checked) > 50
