"""The fault catalogue (configs/rules) with the sidecar's log sections (configs/telemetry.yaml): every example line
of every rule, in every log format its source writes, becomes an event that makes that rule decide its action."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from sigma.chaos.inject import ALIASES, SIGNATURES
from sigma.paths import configs_dir
from sigma.rules.catalogue import FORMATS_BY_TARGET, cases, sidecar_sections, target_of, try_line
from sigma.rules.loader import load_rules

RULES = load_rules(configs_dir() / "rules")
BY_ID = {r.id: r for r in RULES}
SECTIONS = sidecar_sections(configs_dir() / "telemetry.yaml")
CATALOGUE = [r for r in RULES if not (r.health or r.kpi or (r.log and r.log.source == "kpi"))]  # ours, not a vendor's


def test_every_xid_code_has_exactly_one_rule():
    codes = Counter()
    for rule in RULES:
        if rule.log is not None and "xid" in rule.log.kinds:
            codes.update(int(c) for c in rule.log.fields.get("xid", []))
    assert sorted(codes) == list(range(1, 163))
    assert [c for c, n in codes.items() if n > 1] == []


@pytest.mark.parametrize("xid,rule,action", [
    (79, "gpu-xid-79", "drain+reboot"), (160, "gpu-xid-restart-bm", "drain+reboot"),
    (119, "gpu-xid-reset", "drain+reboot"), (46, "gpu-xid-reset", "drain+reboot"), (48, "gpu-xid-repair", "drain"),
    (74, "gpu-xid-74", "drain+ticket"), (149, "gpu-xid-nvlink5", "drain+ticket"), (1, "gpu-xid-support", "drain+ticket"),
    (54, "gpu-xid-mechanicals", "drain+ticket"), (13, "gpu-xid-restart-app", "requeue"),
    (94, "gpu-xid-restart-app", "requeue"), (43, "gpu-xid-record", "record"), (45, "gpu-xid-record", "record"),
    (78, "gpu-xid-software", "notify")])
def test_xid_bucket_actions(xid, rule, action):
    """NVIDIA's resolution bucket decides: RESET_GPU is a node reboot, RESTART_APP a job restart, IGNORE a record."""
    line = f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=4242, name=python, text"
    outcome = try_line(RULES, BY_ID[rule], line, "rfc3164", SECTIONS)
    assert outcome.correct, [(f.rule_id, f.action) for f in outcome.findings]
    assert BY_ID[rule].action == action


def test_every_catalogue_entry_cites_public_sources_and_log_entries_show_real_lines():
    for rule in CATALOGUE:
        assert rule.references and all(re.match(r"https://\S+$", r) for r in rule.references), rule.id
        if rule.log is not None and "*" not in rule.log.kinds:  # "*": NVML's own events, not a log line
            assert rule.examples, f"{rule.id}: no example line"


@pytest.mark.parametrize("rule_id", sorted(r.id for r in RULES if r.log is not None and r.examples))
def test_every_example_in_every_format_acts(rule_id):
    rule = BY_ID[rule_id]
    failed = []
    for r, example, fmt in cases([rule]):
        outcome = try_line(RULES, r, example, fmt, SECTIONS)
        if not outcome.correct:
            failed.append((fmt, outcome.line, [e["kind"] for e in outcome.events],
                           [(f.rule_id, f.action) for f in outcome.findings]))
    assert failed == []
    assert len(cases([rule])) == len(rule.examples) * len(FORMATS_BY_TARGET[target_of(rule)])


def test_old_and_new_driver_wordings_give_the_same_event():
    rule = BY_ID["gpu-xid-79"]
    outcomes = [try_line(RULES, rule, line, "dmesg", SECTIONS) for line in (
        "NVRM: Xid (0000:02:00): 79, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:02:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:02:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")]
    assert [(o.events[0]["kind"], o.events[0]["fields"]["xid"], o.events[0]["fields"]["pci"]) for o in outcomes] == \
        [("xid", 79, "0000:02:00")] * 4
    assert all(o.correct for o in outcomes)


def test_chaos_can_inject_every_log_class():
    for rule in RULES:
        if rule.log is not None and rule.examples:
            assert SIGNATURES[rule.id].rule_id == rule.id
    for alias, rule_id in ALIASES.items():  # the soak's and scripts' short names act too
        assert SIGNATURES[alias].rule_id == rule_id and BY_ID[rule_id].action != "record"
