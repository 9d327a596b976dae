"""A new failure signature, end to end on the local cluster: unknown the first time, learned by the next
`sigma rules learn`, promoted (shadow, then live), and caught by the learned rule when it happens again.

The fault is a kernel-log line injected at its source (`sigma chaos log --line`), shipped by the real sidecars,
stored by the real controller; the first occurrence is recorded as an incident by an admin verdict
(`sigma rules label`), because no rule knows it.
"""

import json
import shutil
import subprocess
import time

import pytest

from sigma.paths import configs_dir
from tests.integration.pipeline import SIGMA, Pipeline, wait_for

pytestmark = pytest.mark.integration

NEW_SIGNATURE = "nvme0: controller fatal status 0x13, resetting controller (CSTS=0x3)"


def test_new_log_signature_is_learned_promoted_and_then_caught_in_seconds(slurm, cluster, tmp_path):
    kb = tmp_path / "rules"
    shutil.copytree(configs_dir() / "rules", kb)
    # two nodes with the learned rule within the hour (node2's observed hit, decided again once the rule is live,
    # and node3's new line): the breaker's share of this 4-node cluster allows two
    with Pipeline(cluster, tmp_path / "pipeline", rules=str(kb), controller={"breaker": {"max_fraction": 0.5}}) as p:
        def cli(*args, check=True):
            out = subprocess.run([SIGMA, *args], env=p.env, capture_output=True, text=True, timeout=120)
            assert not check or out.returncode == 0, out.stdout + out.stderr
            return out

        rules = lambda *args, **kw: cli("rules", *args, "--config", str(p.config), **kw)
        chaos = lambda node: json.loads(cli("chaos", "log", "--node", node, "--line", NEW_SIGNATURE, "--json", "--force",
                                            "--state-dir", str(cluster.state_dir)).stdout)
        try:
            # nothing to learn from yet: a clear message, nothing written
            out = rules("learn", "--since", "1h", check=False)
            assert out.returncode == 2 and "no confirmed incident or fault label" in out.stderr
            assert not (kb / "candidates").exists()

            first = chaos("node2")
            event = wait_for(lambda: p.query("SELECT * FROM events WHERE node = 'node2' AND message LIKE ?",
                                             (f"%{NEW_SIGNATURE}%",)), timeout=30, what="the line at the controller")
            time.sleep(3)
            assert p.incidents() == []  # the knowledge base has no rule for it
            rules("label", "--node", "node2", "--at", str(first["ts"]), "--cause", "nvme controller reset",
                  "--category", "disk")

            out = rules("learn", "--since", "1h")
            assert "candidate written" in out.stdout, out.stdout
            (cand,) = json.loads(rules("candidates", "--json").stdout)
            cid = cand["candidate"]["id"]
            assert cand["candidate"]["provenance"]["sources"] == ["label 1"]
            assert cand["candidate"]["scores"]["test"]["fp"] == 0 and "log" in cand["rule"]
            assert cid in rules("show", cid[:24]).stdout

            # shadow: the controller picks the new file up by itself and records what it would have done
            rules("promote", cid)
            shadow = wait_for(lambda: p.incidents(rule_id=cid), timeout=30, what="a shadow hit")
            assert shadow[0]["node"] == "node2" and shadow[0]["status"] == "shadow"
            assert not slurm.node("node2").drained
            report = json.loads(cli("report", "--config", str(p.config), "--json").stdout)
            assert [(h["rule"], h["hits"], h["targets"]) for h in report["shadow_hits"]] == [(cid, 1, ["node2"])]

            rules("promote", cid, "--live")
            log = p.dir / "log" / "controller.jsonl"
            wait_for(lambda: log.read_text().count("RELOAD applied") >= 2, timeout=30, what="the live rule loaded")
            # node2's hit, observed while the rule was on trial and still current, is decided again now it acts
            wait_for(lambda: slurm.node("node2").drained, timeout=30, what="node2's observed hit decided again")
            assert f"REDECIDE node2 ({cid})" in (p.dir / "log" / "decisions.log").read_text()
            second = chaos("node3")
            node = wait_for(lambda: (n := slurm.node("node3")).drained and n, timeout=30, what="node3 drained")
            assert node.reason.startswith("sigma: learn-") and cid in node.reason
            (inc,) = p.incidents(rule_id=cid, node="node3")
            assert inc["status"] == "acted" and NEW_SIGNATURE in inc["evidence"]["events"][0]["message"]
            print(f"learned rule {cid}: fault on node3 at {second['ts']:.1f}, incident after "
                  f"{inc['opened_at'] - inc['fault_ts']:.1f}s, drained {node.reason!r}")
            assert event[0]["kind"] == "kernel_error"
        finally:
            cli("chaos", "undo", "--all", "--state-dir", str(cluster.state_dir), check=False)
