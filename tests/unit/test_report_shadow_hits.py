"""`sigma report` lists what rules in shadow mode would have done (a newly promoted learned rule, say)."""

import time

from sigma.cli import main
from sigma.controller.db import open_db
from sigma.controller.report.metrics import report


def incident(conn, rule, node, status, ts):
    with conn:
        conn.execute("INSERT INTO incidents (key, opened_at, updated_at, rule_id, source, scope, node, severity, action,"
                     " fault_ts, status) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                     (f"{rule}|{node}|", ts, ts, rule, "rule", "node", node, "error", "drain", ts - 1, status))


def test_shadow_hits_per_rule(tmp_path, capsys):
    conn = open_db(tmp_path / "c.db")
    now = time.time()
    incident(conn, "learned-nvme-1", "node2", "shadow", now - 100)
    incident(conn, "learned-nvme-1", "node3", "shadow", now - 40)
    incident(conn, "gpu-xid-79", "node1", "acted", now - 80)
    hits = report(conn, since=now - 3600, now=now)["shadow_hits"]
    assert hits == [{"rule": "learned-nvme-1", "hits": 2, "targets": ["node2", "node3"], "last": now - 40}]
    assert report(conn, since=now - 60, now=now)["shadow_hits"][0]["hits"] == 1
    assert main(["report", "--db", str(tmp_path / "c.db"), "--since", "1h"]) == 0
    out = capsys.readouterr().out
    assert "shadow hits: learned-nvme-1 would have acted on node2, node3 (2 hits" in out
