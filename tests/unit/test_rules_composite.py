"""Composite conditions (all/any, peer rank) through the real matcher; unsafe regexes are refused."""

import pytest

from sigma.config import ConfigError, from_dict
from sigma.rules.loader import load_rules
from sigma.rules.matcher import evaluate
from sigma.rules.regexcheck import UnsafeRegex, check_regex
from sigma.rules.schema import Rule

EDAC = "EDAC MC0: 1 CE memory read error"


def rule(composite, **kw):
    return from_dict(Rule, {"id": "t", "description": "d", "severity": "error", "action": "drain",
                            "composite": composite, **kw})


def samples(values: dict, metric="gpu.dram.ce", t0=100.0):
    """values: node -> (first, last) of a counter over the window."""
    return [{"node": n, "ts": t0 + dt, "metric": metric, "value": v, "labels": {}}
            for n, (a, b) in values.items() for dt, v in ((0.0, a), (50.0, b))]


def events(nodes, message=EDAC, ts=140.0):
    return [{"node": n, "ts": ts, "source": "log", "kind": "kernel_error", "message": message} for n in nodes]


JOBS = {n: [7] for n in ("node1", "node2", "node3")}
PEER = {"peer_rank": {"metric": "gpu.dram.ce", "agg": "delta", "top_k": 1, "min_gap": 50, "window_s": 300}}
LOG = {"log": {"source": "log", "message": "EDAC MC\\d+: \\d+ CE memory read error", "window_s": 300}}


def test_all_of_log_and_peer_rank_names_only_the_node_that_leads_its_peers():
    r = rule({"all": [LOG, PEER]})
    s = samples({"node1": (0, 100), "node2": (500, 800), "node3": (50, 160)})
    (f,) = evaluate([r], now=200.0, events=events(JOBS), samples=s, jobs_on_node=JOBS)
    assert f.node == "node2" and f.action == "drain"
    kinds = [next(iter(c)) for c in f.evidence["conditions"]]
    assert kinds == ["log", "peer_rank"]
    assert f.evidence["conditions"][1]["peer_rank"]["rank"] == 1


def test_same_message_everywhere_without_a_leader_matches_nothing():
    r = rule({"all": [LOG, PEER]})
    s = samples({"node1": (0, 100), "node2": (500, 620), "node3": (50, 160)})  # node2 ahead by 10 only
    assert evaluate([r], now=200.0, events=events(JOBS), samples=s, jobs_on_node=JOBS) == []


def test_any_is_the_union_and_nested_conditions_work():
    r = rule({"any": [{"log": {"message": "nvme\\d+: controller fatal"}},
                      {"all": [LOG, PEER]}]})
    s = samples({"node1": (0, 100), "node2": (500, 800), "node3": (50, 160)})
    ev = events(JOBS) + events(["node4"], "nvme0: controller fatal status 0x13, resetting")
    found = sorted(f.node for f in evaluate([r], now=200.0, events=ev, samples=s, jobs_on_node=JOBS))
    assert found == ["node2", "node4"]


def test_peer_rank_needs_peers_and_respects_the_node_window_since():
    r = rule({"all": [PEER]})
    alone = {"node2": [7]}
    assert evaluate([r], now=200.0, samples=samples({"node2": (0, 900)}), jobs_on_node=alone) == []
    s = samples({"node1": (0, 100), "node2": (500, 800), "node3": (50, 160)})
    assert evaluate([r], now=200.0, samples=s, jobs_on_node=JOBS, since={"node2": 180.0}) == []


def test_composite_rules_load_from_yaml_and_errors_name_the_key(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("version: 1\nrules:\n  - id: dimm\n    description: d\n    severity: error\n    action: drain\n"
                 "    composite:\n      all:\n        - peer_rank: {metric: m, top_k: 0}\n")
    with pytest.raises(ConfigError, match=r"r.yaml:9 \[rules.0.composite.all.0.peer_rank\].*top_k >= 1"):
        load_rules(f)
    f.write_text("version: 1\nrules:\n  - id: dimm\n    description: d\n    severity: error\n    action: drain\n"
                 "    composite:\n      all:\n        - {log: {message: x}, metric: {metric: m, op: '>', value: 1}}\n")
    with pytest.raises(ConfigError, match="exactly one of"):
        load_rules(f)
    with pytest.raises(ValueError, match="scope: node"):
        rule({"all": [LOG]}, scope="job", action="requeue")


def test_catastrophic_regex_is_refused_in_a_composite_and_by_the_check():
    with pytest.raises(ConfigError, match="catastrophic"):
        rule({"all": [{"log": {"message": "(a+)+$"}}]})
    for bad in ("(a+)+$", r"(\w+\s?)*$", "(x+x+)+y"):
        with pytest.raises(UnsafeRegex):
            check_regex(bad)
    for good in (r"task .* blocked for more than \d+ seconds", r"nvme\d+:\s+controller\s+\S*,", r"(?:\S+\s+){0,3}x"):
        check_regex(good)
    with pytest.raises(UnsafeRegex, match="invalid regex"):
        check_regex("foo[")


def test_shipped_knowledge_base_still_loads():
    from sigma.paths import configs_dir

    assert len(load_rules(configs_dir() / "rules")) >= 10
