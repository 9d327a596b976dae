"""Rule learning on a real controller database: labels in, candidates out; review, safety and bad input."""

import shutil

import pytest
import yaml

from sigma.paths import configs_dir
from sigma.rules.learn import LearnError
from sigma.rules.learn.config import LearnConfig
from sigma.rules.learn.history import problems
from sigma.rules.learn.run import Breaker, run
from sigma.rules.learn.store import Candidates
from sigma.rules.loader import load_rules
from tests.unit.rules_learn_helpers import NVME, T0, FakeHistory


@pytest.fixture
def kb(tmp_path):
    shutil.copytree(configs_dir() / "rules", tmp_path / "rules")
    return tmp_path / "rules"


def learn(h, kb, **cfg):
    cfg.setdefault("proposers", ["deterministic"])
    return run(h.conn, LearnConfig(**cfg), load_rules(kb), Candidates(kb), since=T0, breaker=Breaker(),
               total_nodes=4, now=h.end)


def only_candidate(kb):
    (record,) = Candidates(kb).all()
    return record


def test_new_log_signature_becomes_a_log_rule_with_provenance_scores_and_examples(tmp_path, kb):
    h = FakeHistory(tmp_path / "c.db")
    for node, dt in (("node2", 3600), ("node3", 5400), ("node1", 8000)):
        h.nvme_fault(node, T0 + dt)
    result = learn(h, kb)
    c = only_candidate(kb)
    meta, r = c["candidate"], c["rule"]
    assert result["candidates"] == [str(kb / "candidates" / f"{meta['id']}.yaml")]
    assert r["id"].startswith("learned-nvme-controller-reset-") and r["category"] == "disk"
    assert "controller\\s+fatal\\s+status" in r["log"]["message"]
    assert meta["provenance"]["sources"] == ["label 1", "label 2", "label 3"]
    assert meta["scores"]["test"]["recall"] == 1.0 and meta["scores"]["test"]["fp"] == 0
    assert meta["scores"]["knowledge_base_test"]["recall"] == 0.0  # the knowledge base did not know it
    assert meta["examples"]["right"] and not meta["in_sample"]
    # the rule, loaded as the controller would, fires on a fresh occurrence on another node and not on noise
    rule = Candidates(kb).get(meta["id"])["rule"]
    from sigma.rules.learn.review import repair
    from sigma.rules.matcher import evaluate

    live = repair(rule)
    line = f"Jan 1 00:00:00 node4 kernel: [ 1.0] {NVME.format(code=42)}"
    rows = [{"node": "node4", "ts": 9.0, "source": "log", "kind": "kernel_error", "message": line},
            {"node": "node1", "ts": 9.0, "source": "log", "kind": "kernel_error", "message": "usb 1-1: reset"}]
    assert [f.node for f in evaluate([live], now=10.0, events=rows)] == ["node4"]
    # the rejected proposals come with their evidence: the healthy windows they matched
    rejected = result["causes"][0]["rejected"]
    assert all(r["reasons"] for r in rejected)


def test_same_message_on_every_node_is_told_apart_by_the_peer_ranking(tmp_path, kb):
    """The paper's case 1: a memory-error message that user code causes on every node of a job, and a bad DIMM
    whose node's error counter leads its peers. Neither feature alone separates them (the message appears on
    healthy nodes; patrol scrubbing makes a healthy node's counter lead too), so the first round's rules are
    rejected with their evidence and the second round combines the log template with the peer ranking."""
    h = FakeHistory(tmp_path / "c.db", hours=4.5)
    for i, bad in enumerate(["node2", None, "node3", None, "node1", None, "node4", None, "node2"]):
        h.edac_job(T0 + 1800 + i * 1500, 100 + i, bad)
        if i % 2:  # far enough from the messages that no window holds both
            h.scrub_job(T0 + 2550 + i * 1500, 200 + i, ["node1", "node3", "node4", "node2"][i % 4])
    result = learn(h, kb)
    c = only_candidate(kb)
    leaves = c["rule"]["composite"]["all"]
    assert c["candidate"]["round"] == 2
    assert any("peer_rank" in leaf and leaf["peer_rank"]["metric"] == "gpu.dram.ce" for leaf in leaves)
    assert any("log" in leaf and "EDAC" in leaf["log"]["message"] for leaf in leaves)
    assert c["candidate"]["scores"]["test"] == {**c["candidate"]["scores"]["test"], "tp": 2, "fp": 0, "fn": 0}
    rejected = result["causes"][0]["rejected"]
    edac = [r for r in rejected if "EDAC" in str(r["evidence"])]
    assert edac and any("healthy windows" in reason for reason in edac[0]["reasons"])
    assert edac[0]["evidence"][0]["label"] == "healthy"
    assert result["causes"][0]["rounds"] == 2 and result["causes"][0]["accepted"] >= 1


def test_fp_budget_and_breaker_reject_a_rule_matching_healthy_history(tmp_path, kb):
    h = FakeHistory(tmp_path / "c.db")
    # a "fault" whose only line is everyday noise: any rule for it matches healthy history
    with h.conn:
        h.event("node2", T0 + 3600, "usb 1-1: reset high-speed USB device number 2 using xhci_hcd")
    from sigma.rules.learn.history import add_label

    add_label(h.conn, node="node2", fault_ts=T0 + 3600, verdict="fault", cause="usb")
    result = learn(h, kb)
    assert result["candidates"] == [] and Candidates(kb).all() == []
    rej = next(r for r in result["causes"][0]["rejected"] if "usb" in str(r["evidence"][:1]).lower())
    assert any("false-positive budget" in x for x in rej["reasons"])
    assert any("circuit breaker allows 1" in x for x in rej["reasons"])
    assert rej["evidence"] and all(e["label"] == "healthy" for e in rej["evidence"])


def test_too_few_incidents_missing_window_and_no_healthy_history_are_clear_errors(tmp_path, kb):
    h = FakeHistory(tmp_path / "c.db", hours=1)
    with pytest.raises(LearnError, match="no confirmed incident or fault label"):
        learn(h, kb)
    from sigma.rules.learn.history import add_label

    add_label(h.conn, node="node9", fault_ts=T0 + 1800, verdict="fault", cause="ghost")  # no telemetry for it
    with pytest.raises(LearnError, match=r"ghost: 0 confirmed incident\(s\) with data.*label 1 \(node9.*no telemetry"):
        learn(h, kb)
    h.nvme_fault("node2", T0 + 1800)
    with pytest.raises(LearnError, match="min_incidents is 2"):
        learn(h, kb, min_incidents=2)
    with pytest.raises(LearnError, match="min_normal_windows is 5000"):
        learn(h, kb, min_normal_windows=5000)
    assert not (kb / "candidates").exists()  # nothing half-written


def test_single_incident_is_learned_in_sample(tmp_path, kb):
    h = FakeHistory(tmp_path / "c.db", hours=1)
    h.nvme_fault("node2", T0 + 1800)
    (p,) = problems(h.conn, LearnConfig(), since=T0, now=h.end)
    assert p.in_sample and p.positives("test") == p.positives("train")
    learn(h, kb)
    assert only_candidate(kb)["candidate"]["in_sample"] is True


def test_promote_shadow_then_live_and_a_bad_promotion_leaves_the_knowledge_base_untouched(tmp_path, kb):
    h = FakeHistory(tmp_path / "c.db", hours=1)
    h.nvme_fault("node2", T0 + 1800)
    learn(h, kb)
    store = Candidates(kb)
    cid = store.all()[0]["candidate"]["id"]
    before = {p.name: p.read_text() for p in kb.glob("*.yaml")}
    assert store.promote(cid[:20])["candidate"]["status"] == "shadow"
    (rule,) = [r for r in load_rules(kb) if r.id == cid]
    assert rule.shadow and rule.drains
    assert {p.name: p.read_text() for p in kb.glob("*.yaml") if p.name != "learned.yaml"} == before
    store.promote(cid, live=True)
    (rule,) = [r for r in load_rules(kb) if r.id == cid]
    assert not rule.shadow and store.get(cid)["candidate"]["status"] == "live"
    # a candidate whose rule would clash with the knowledge base: refused, learned.yaml unchanged
    learned = (kb / "learned.yaml").read_text()
    clash = store.get(cid)
    clash["candidate"]["id"] = "clash"
    clash["rule"]["id"] = "gpu-xid-79"
    store.write(clash)
    with pytest.raises(LearnError, match="duplicate rule id 'gpu-xid-79'"):
        store.promote("clash")
    assert (kb / "learned.yaml").read_text() == learned
    assert not [p for p in kb.iterdir() if p.name.startswith(".")]  # no temporary file left behind
    store.set_status("clash", "rejected", reason="duplicate")
    with pytest.raises(LearnError, match="was rejected"):
        store.promote("clash")


def test_promoted_rule_reaches_the_running_controller_and_drains_no_more_than_the_breaker_allows(tmp_path, kb):
    """The controller re-reads the knowledge base when learned.yaml appears; live, the learned rule goes through
    the decider like any rule, so the circuit breaker bounds its drains."""
    from sigma.controller.act.guards import breaker_limit
    from sigma.controller.config import BreakerConfig, ControllerConfig
    from sigma.controller.act.decisionlog import DecisionLog
    from sigma.controller.config import RemediationConfig
    from sigma.controller.db import open_db
    from sigma.controller.loop import Controller
    from tests.unit.controller.fakes import FakeSlurm
    from tests.unit.controller.helpers import Clock, add_event

    h = FakeHistory(tmp_path / "c.db", hours=1)
    h.nvme_fault("node2", T0 + 1800)
    learn(h, kb)
    cid = Candidates(kb).all()[0]["candidate"]["id"]
    nodes = tuple(f"node{i}" for i in range(1, 9))
    cfg = ControllerConfig(db=str(tmp_path / "ctl.db"), log_dir=str(tmp_path / "log"), rules=str(kb),
                           breaker=BreakerConfig(max_nodes=8, max_fraction=0.25))
    slurm, clock = FakeSlurm(nodes), Clock()
    ctl = Controller(cfg, conn=open_db(cfg.db), slurm=slurm, remediation=RemediationConfig(ack_kernel_log=False),
                     log=DecisionLog(cfg.log_dir), clock=clock, root=tmp_path)  # rules read from cfg.rules
    ctl.tick()
    assert cid not in {r.id for r in ctl.rules}
    Candidates(kb).promote(cid, live=True)
    line = f"Jan 1 00:00:00 x kernel: [ 1.0] {NVME.format(code=1)}"
    for n in nodes:
        add_event(ctl.conn, n, clock() - 1, kind="kernel_error", message=line)
    ctl.tick()
    assert cid in {r.id for r in ctl.rules}
    drained = [n for n in nodes if slurm.node(n).drained]
    assert len(drained) == breaker_limit(8, 8, 0.25) == 2
    statuses = [r["status"] for r in ctl.conn.execute("SELECT status FROM incidents WHERE rule_id = ?", (cid,))]
    assert statuses.count("acted") == 2 and statuses.count("escalated") == 6


def test_learn_config_rejects_unknown_keys_with_the_line(tmp_path):
    from sigma.config import ConfigError
    from sigma.rules.learn.config import load_learn_config

    assert load_learn_config(configs_dir() / "learn.yaml") == LearnConfig()
    bad = tmp_path / "learn.yaml"
    bad.write_text("since: 7d\nfp_budgett: 0.1\n")
    with pytest.raises(ConfigError, match=r"learn.yaml:2 \[fp_budgett\]: unknown key"):
        load_learn_config(bad)


def test_candidate_files_are_plain_yaml_with_rule_and_candidate(tmp_path, kb):
    h = FakeHistory(tmp_path / "c.db", hours=1)
    h.nvme_fault("node2", T0 + 1800)
    learn(h, kb)
    (path,) = (kb / "candidates").glob("*.yaml")
    data = yaml.safe_load(path.read_text())
    assert set(data) == {"candidate", "rule"} and data["candidate"]["status"] == "candidate"
    assert len(load_rules(kb)) == len(load_rules(configs_dir() / "rules"))  # candidates never run


def test_recovered_isolation_incidents_are_learned_from_and_one_can_be_picked(tmp_path, kb):
    """An isolation confirmed by recovery is a label by itself; --incident picks any one incident."""
    h = FakeHistory(tmp_path / "c.db", hours=2)
    with h.conn:
        for node, dt, status in (("node2", 1800, "resolved"), ("node4", 4000, "acted")):
            h.event(node, T0 + dt, NVME.format(code=5))
            h.conn.execute("INSERT INTO incidents (key, opened_at, updated_at, rule_id, source, scope, node, severity,"
                           " action, category, fault_ts, status) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                           (f"isolation-outlier|{node}|", T0 + dt + 60, T0 + dt + 60, "isolation-outlier",
                            "isolation", "node", node, "error", "drain", "isolation", T0 + dt, status))
    (p,) = problems(h.conn, LearnConfig(), since=T0, now=h.end)
    assert p.cause == "isolation" and p.provenance["sources"] == ["incident 1"]  # 'acted' is not confirmed yet
    (p,) = problems(h.conn, LearnConfig(), since=T0, now=h.end, incident=2)
    assert p.provenance["sources"] == ["incident 2"]
    from sigma.rules.learn.history import add_label

    add_label(h.conn, node="node4", fault_ts=T0 + 4000, verdict="fault", cause="nvme reset", incident_id=2)
    causes = {p.cause: p.provenance["sources"] for p in problems(h.conn, LearnConfig(), since=T0, now=h.end)}
    assert causes == {"isolation": ["incident 1"], "nvme reset": ["incident 2"]}  # the admin's verdict confirms it
    with pytest.raises(LearnError, match="no incident 7"):
        problems(h.conn, LearnConfig(), since=T0, now=h.end, incident=7)
    learn(h, kb)
    found = {c["candidate"]["cause"]: c["rule"]["log"]["message"] for c in Candidates(kb).all()}
    assert set(found) == {"isolation", "nvme reset"} and all("controller\\s+fatal" in m for m in found.values())


def test_learning_again_keeps_an_admins_rejection(tmp_path, kb):
    h = FakeHistory(tmp_path / "c.db", hours=1)
    h.nvme_fault("node2", T0 + 1800)
    learn(h, kb)
    cid = only_candidate(kb)["candidate"]["id"]
    Candidates(kb).set_status(cid, "rejected", reason="known, handled elsewhere")
    result = learn(h, kb)
    assert result["candidates"] == [] and any("it was rejected before" in n for n in result["notes"])
    assert only_candidate(kb)["candidate"]["status"] == "rejected"


def test_review_bound_is_the_controllers_breaker():
    """sigma.rules does not import the controller; its copy of the breaker must stay the same as the controller's."""
    from sigma.controller.act.guards import breaker_limit
    from sigma.controller.config import BreakerConfig

    b, mine = BreakerConfig(), Breaker()
    assert (mine.max_nodes, mine.max_fraction, mine.window_s) == (b.max_nodes, b.max_fraction, b.window_s)
    for total in (1, 3, 4, 8, 40, 1000):
        assert mine.limit(total) == breaker_limit(total, b.max_nodes, b.max_fraction)
