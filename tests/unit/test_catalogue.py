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


def test_every_xid_code_of_the_catalogue_has_exactly_one_bucket_rule():
    """Codes 1-172 (the catalogue's newest): each in one rule of its resolution bucket; rules that refine a bucket by
    what the line says (a message, an extracted field) come on top, and a newer code is reported."""
    codes, refined = Counter(), set()
    for rule in RULES:
        if rule.log is not None and "xid" in rule.log.kinds:
            xids = [int(c) for c in rule.log.fields.get("xid", [])]
            if rule.log.message or set(rule.log.fields) - {"xid"}:
                refined.update(xids)
            else:
                codes.update(xids)
    assert sorted(codes) == [c for c in range(1, 173) if c not in (144, 145, 146, 147, 148, 149, 150, 154)]
    assert [c for c, n in codes.items() if n > 1] == []
    assert refined == {94, 144, 145, 146, 147, 148, 149, 150, 154}


@pytest.mark.parametrize("xid,rule,action", [
    (79, "gpu-xid-79", "drain+reboot"), (151, "gpu-xid-restart-bm", "drain+reboot"),
    (119, "gpu-xid-reset", "drain+reboot"), (46, "gpu-xid-reset", "drain+reboot"), (95, "gpu-xid-reset", "drain+reboot"),
    (48, "gpu-xid-repair", "drain"), (171, "gpu-xid-repair", "drain"), (74, "gpu-xid-74", "drain+ticket"),
    (149, "gpu-xid-nvlink5", "drain+ticket"), (1, "gpu-xid-support", "drain+ticket"),
    (54, "gpu-xid-mechanicals", "drain+ticket"), (13, "gpu-xid-restart-app", "requeue"),
    (94, "gpu-xid-restart-app", "requeue"), (43, "gpu-xid-record", "record"), (45, "gpu-xid-record", "record"),
    (160, "gpu-xid-record", "record"), (162, "gpu-xid-record", "record"), (78, "gpu-xid-software", "notify"),
    (164, "gpu-xid-power-smoothing", "notify"), (167, "gpu-xid-restart-bm", "drain+reboot"),
    (168, "gpu-xid-memory-capacity", "drain+ticket"), (199, "gpu-xid-unknown", "notify")])
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


@pytest.mark.parametrize("sample,expected", [
    ("BGL/BGL_2k.log", {"filesystem-error": 11}),  # "Lustre mount FAILED": the node cannot reach its filesystem
    ("HPC/HPC_2k.log", {}),
    ("Thunderbird/Thunderbird_2k.log", {}),  # one "NIC Link is Up": an event, no action
])
def test_public_loghub_samples_act_only_where_they_should(sample, expected):
    """Thousands of real cluster log lines (loghub): the catalogue acts on the failures it names and on nothing else
    (BGL's register dumps around machine checks are not an uncorrectable memory error)."""
    from sigma.rules.catalogue import act_on_file
    from tests.conftest import SHARED_DATA

    path = SHARED_DATA / "loghub" / sample
    if not path.exists():
        pytest.skip(f"{path} not available")
    events, findings = act_on_file(RULES, SECTIONS, path)
    assert {f.rule_id: f.evidence["count"] for f in findings} == expected


def test_every_xid_chaos_can_inject_is_acted_on_by_its_bucket():
    from sigma.chaos.inject import xid_line

    rule_of = {int(c): r for r in RULES if r.log is not None and "xid" in r.log.kinds and not r.log.message
               and set(r.log.fields) == {"xid"} for c in r.log.fields["xid"]}
    missed = [code for code in range(1, 173) if code not in (144, 145, 146, 147, 148, 149, 150, 154)
              and not try_line(RULES, rule_of[code], xid_line(code), "rfc3164", SECTIONS).correct]
    assert missed == []
