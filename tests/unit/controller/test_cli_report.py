"""Report figures from a recorded scenario, the CLI over that database, and GET /metrics."""

import json
import urllib.request

import pytest

from sigma.cli import main
from sigma.controller.report.metrics import report

from tests.unit.controller.helpers import add_kpi, make_controller, xid79
from tests.unit.controller.test_decisions import run_until


@pytest.fixture
def scenario(tmp_path):
    """A job runs on node2+node3; Xid 79 on node3; the job is requeued and resumes on node1+node2;
    node3 is rebooted, validated and resumed."""
    ctl, slurm, clock = make_controller(tmp_path)
    t0 = clock()
    slurm.run_job(7, ["node2", "node3"], start=t0)
    for s in range(30):
        ctl.tick() if s % 10 == 0 else None
        add_kpi(ctl.conn, "node2", t0 + s, 7, 0, s)
        clock.advance(1)
    fault = clock() - 0.5
    xid79(ctl.conn, "node3", fault)
    clock.advance(1)
    ctl.tick()
    slurm.set_job(7, state="RUNNING", nodes=("node1", "node2"), start_time=int(clock()))
    slurm.set_node("node1", state="allocated", alloc_cpus=2)
    clock.advance(8)
    add_kpi(ctl.conn, "node1", clock(), 7, 0, 30)
    assert run_until(ctl, clock, lambda: slurm.count("reboot") == 1)
    slurm.finish_reboot("node3", clock())
    assert run_until(ctl, clock, lambda: slurm.count("submit") == 1)
    job = next(j for j in slurm.jobs() if j.name.startswith("sigma-validate"))
    slurm.finish_job(job.job_id, 0)
    assert run_until(ctl, clock, lambda: ctl.remediator.get("node3").state == "resumed")
    return ctl, tmp_path / "c.db", fault


def test_report_figures(scenario):
    ctl, db, fault = scenario
    rep = report(ctl.conn, now=ctl.clock())
    rec = rep["jobs"]["recoveries"][0]
    assert rec["job_id"] == 7 and rec["time_to_failure_s"] == pytest.approx(30.5, abs=1)
    assert rec["recovery_s"] == pytest.approx(9.5, abs=0.1)  # fault -> first step after resume
    cyc = rep["recycling"]["cycles"][0]
    assert cyc["node"] == "node3" and cyc["state"] == "resumed"
    assert cyc["detect_s"] == pytest.approx(1.5, abs=0.1)
    assert cyc["total_s"] == pytest.approx(cyc["detect_s"] + cyc["triage_s"] + cyc["repair_s"] + cyc["validate_s"],
                                           abs=0.01)
    assert rep["automation"] == {"automatic": 1, "manual": 0, "ratio": 1.0}
    u = rep["utilisation"]
    assert 0 < u["effective"] < u["allocated"] <= 1 and 0 < u["available"] < 1


def test_cli_commands(scenario, capsys):
    ctl, db, fault = scenario
    assert main(["incidents", "--db", str(db), "--json"]) == 0
    incs = json.loads(capsys.readouterr().out)
    assert [(i["rule_id"], i["node"], i["status"]) for i in incs] == [("gpu-xid-79", "node3", "resolved")]
    assert main(["explain", str(incs[0]["id"]), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "gpu-xid-79" in out and "Xid" in out and "reboot" in out and "resumed" in out
    assert main(["incidents", "--db", str(db), "--node", "node1"]) == 0
    assert "0 incidents" in capsys.readouterr().out
    assert main(["incidents", "--db", str(db), "--node", "node9"]) == 2
    assert "no node 'node9' known to the controller; its nodes: node1, node2, node3, node4" in capsys.readouterr().err
    assert main(["nodes", "--db", str(db)]) == 0
    assert "resumed" in capsys.readouterr().out
    assert main(["report", "--db", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["automation"]["ratio"] == 1.0
    assert main(["report", "--db", str(db)]) == 0
    assert "utilisation" in capsys.readouterr().out
    assert main(["controller", "rules"]) == 0
    assert "gpu-xid-79" in capsys.readouterr().out


def test_explain_unknown_incident_is_a_clear_error(scenario, capsys):
    ctl, db, _ = scenario
    assert main(["explain", "999", "--db", str(db)]) == 2
    assert "no incident 999" in capsys.readouterr().err


def test_metrics_endpoint(scenario):
    from prometheus_client import generate_latest

    from sigma.controller.daemon import MetricsServer
    from sigma.controller.report.prometheus import registry

    ctl, db, _ = scenario
    reg = registry(str(db), stats=lambda: {"ticks_total": 3})
    server = MetricsServer("127.0.0.1:0", lambda: generate_latest(reg))
    server.start()
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read().decode()
    finally:
        server.stop()
    assert 'sigma_incidents_total{rule="gpu-xid-79",status="resolved"} 1.0' in body
    assert 'sigma_actions_total{kind="reboot",state="done"} 1.0' in body
    assert "sigma_automation_ratio" in body and "sigma_controller_ticks_total 3.0" in body


def test_nodes_repaired_marks_a_manual_node(tmp_path, capsys):
    from tests.unit.controller.helpers import add_event

    ctl, slurm, clock = make_controller(tmp_path)
    add_event(ctl.conn, "node2", clock() - 1, source="health", kind="suite.prolog", severity="reject",
              fields={"suite": "prolog"})
    assert run_until(ctl, clock, lambda: ctl.remediator.get("node2").state == "remediating")
    db = str(tmp_path / "c.db")
    assert main(["nodes", "--db", db, "--repaired", "node1"]) == 2
    assert "not waiting for a repair" in capsys.readouterr().err
    assert main(["nodes", "--db", db, "--repaired", "node2"]) == 0
    assert run_until(ctl, clock, lambda: slurm.count("submit") == 1)


def test_a_fault_seen_twice_counts_once_in_the_automation_ratio(tmp_path):
    """The epilog failing on the node an Xid just drained is the same fault: one incident handled, not two."""
    from tests.unit.controller.helpers import add_event

    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(7, ["node2", "node3"], start=clock())
    xid79(ctl.conn, "node3", clock() - 0.5)
    ctl.tick()
    add_event(ctl.conn, "node3", clock(), source="health", kind="suite.epilog", severity="reject",
              fields={"suite": "epilog"})
    clock.advance(1)
    ctl.tick()
    rules = sorted(i.rule_id for i in ctl.incidents.query())
    assert rules == ["gpu-xid-79", "health-epilog-failed"], rules
    assert report(ctl.conn, now=clock())["automation"] == {"automatic": 1, "manual": 0, "ratio": 1.0}


def test_html_report_is_one_page_with_its_plots(scenario, tmp_path, capsys):
    import base64
    import re

    ctl, db, _ = scenario
    page = tmp_path / "report.html"
    assert main(["report", "--db", str(db), "--html", str(page)]) == 0
    text = page.read_text()
    images = re.findall(r"<img alt='([^']+)' src='data:image/png;base64,([^']+)'>", text)
    assert [alt for alt, _ in images] == ["utilisation over time", "incident timeline per node",
                                          "recovery and recycle time distributions", "automation ratio"]
    assert all(base64.b64decode(data).startswith(b"\x89PNG") for _, data in images)
    assert "gpu-xid-79" in text and "automation ratio 1.00" in text
    assert "http" not in text.replace("http-equiv", "")  # nothing fetched from elsewhere


def test_html_report_renders_in_headless_chromium(scenario, tmp_path):
    """The page as a browser shows it: its four plots decoded and painted (the utilisation fill is visible)."""
    import shutil
    import subprocess

    import numpy as np
    from matplotlib.image import imread

    chromium = shutil.which("chromium")
    assert chromium, "chromium is missing: `make test` installs it (apt-get install chromium)"
    ctl, db, _ = scenario
    page = tmp_path / "report.html"
    assert main(["report", "--db", str(db), "--html", str(page)]) == 0
    browser = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,2600"]
    dom = subprocess.run([*browser, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.stdout.count("<img alt=") == 4 and "data:image/png;base64," in dom.stdout, dom.stderr[-2000:]
    shot = tmp_path / "shot.png"
    subprocess.run([*browser, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=True)
    pixels = (imread(shot)[..., :3] * 255).round().astype(int)
    fill = np.array([0x33, 0x77, 0xcc])  # "#37c" at alpha 0.35 over white, or the bars at full strength
    blended = np.round(255 - 0.35 * (255 - fill)).astype(int)
    painted = sum(int((np.abs(pixels - c).sum(axis=-1) <= 12).sum()) for c in (fill, blended))
    assert painted > 2000, f"the plots did not render: {painted} plot-coloured pixels in {shot}"


def test_recycling_counts_a_second_repair_as_repair_not_validation(tmp_path):
    """A validation that fails (a new fault, a repair that did not take) sends the node back to remediating: the
    cycle's repair and validation are the time spent in each state, not first-entry to resumed."""
    from sigma.controller.db import open_db
    from sigma.controller.report.metrics import recycling

    conn = open_db(str(tmp_path / "c.db"))
    with conn:
        conn.execute("INSERT INTO incidents (key, opened_at, updated_at, rule_id, source, scope, node, severity,"
                     " action, summary, fault_ts, status) VALUES ('k', 100, 100, 'ib-port-down', 'rule', 'node',"
                     " 'node1', 'error', 'drain+ticket', 'x', 99, 'resolved')")
        for ts, to in ((100, "drained"), (101, "waiting_jobs"), (130, "remediating"), (3730, "validating"),
                       (4630, "remediating"), (90_000, "validating"), (90_900, "resumed")):
            conn.execute("INSERT INTO lifecycle_transitions (node, cycle, ts, to_state, incident_id) VALUES"
                         " ('node1', 1, ?, ?, 1)", (ts, to))
    (c,) = recycling(conn, 0)
    assert (c["detect_s"], c["triage_s"], c["repair_s"], c["validate_s"]) == (1, 30, 3600 + 85_370, 900 + 900)
    assert c["total_s"] == c["detect_s"] + c["triage_s"] + c["repair_s"] + c["validate_s"]
