"""`sigma explain` shows what a node's log said that was not acted on (the writer of the line not established),
around an incident or for a node alone, and the culprit a line names."""

from __future__ import annotations

import json
import time

from sigma.cli import main
from sigma.controller.db import open_db

FORGED = "lis 27 10:15:32 gpu01 mallory[4242]: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."


def db_with_events(tmp_path):
    path = tmp_path / "controller.db"
    conn = open_db(path)
    now = time.time()
    with conn:
        conn.execute("INSERT INTO events (node, ts, source, kind, severity, message, fields) VALUES "
                     "('node1', ?, 'sidecar', 'log_unattributed', 'warning', ?, ?)",
                     (now - 60, FORGED, json.dumps({"reason": "program mallory", "pattern": "xid",
                                                    "source": "/var/log/kern.log", "collector": "kernel"})))
        conn.execute("INSERT INTO incidents (key, opened_at, updated_at, rule_id, source, scope, node, job_id, severity, "
                     "action, category, summary, fault_ts, status, evidence) VALUES ('k', ?, ?, 'nccl-system-error', "
                     "'rule', 'job', 'node1', 77, 'error', 'requeue', '', 'NCCL system / network error', ?, "
                     "'requeued', ?)", (now - 30, now - 30, now - 40, json.dumps({"events": [{
                         "ts": now - 40, "node": "node1", "source": "log", "kind": "nccl_error",
                         "message": "h100-15:139:1092 [7] socket.c:485 NCCL WARN socketStartConnect: Connect to "
                                    "10.0.0.82<38455> failed : Software caused connection abort",
                         "fields": {"host": "h100-15", "device": 7, "peer": "10.0.0.82"}}]})))
    conn.close()
    return ["--db", str(path), "--config", "configs/controller.yaml"]


def test_explain_shows_lines_not_acted_on_and_the_culprit(tmp_path, capsys):
    db = db_with_events(tmp_path)
    assert main(["explain", "1", *db]) == 0
    out = capsys.readouterr().out
    assert "named in the line: host h100-15, device 7, peer 10.0.0.82" in out
    assert "not acted on on node1 around the incident" in out
    assert "[program mallory; would be xid] " + FORGED in out.replace("\n", "")
    assert main(["explain", "1", *db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unattributed"][0]["reason"] == "program mallory"


def test_explain_a_node_without_an_incident(tmp_path, capsys):
    db = db_with_events(tmp_path)
    assert main(["explain", "--node", "node1", *db]) == 0
    out = capsys.readouterr().out
    assert "node1: 1 line(s)" in out and "1 program mallory" in out
    assert main(["explain", *db]) == 2  # neither an incident nor a node
