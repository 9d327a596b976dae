"""The NVSwitch SXid catalogue (configs/rules/nvswitch.yaml): every line of an SXid report gets exactly one SXid rule,
decided by its code where the Fabric Manager guide lists it and by the driver's own word where it does not; real
published SXid lines, those the rules were chosen on and those held apart to check them, get the action an admin
wants."""

from __future__ import annotations

import pytest

from sigma.paths import configs_dir
from sigma.rules.catalogue import act_on_file, sidecar_sections
from sigma.rules.loader import load_rules
from sigma.rules.matcher import evaluate

RULES = load_rules(configs_dir() / "rules")
SECTIONS = sidecar_sections(configs_dir() / "telemetry.yaml")
SXID_RULES = {r.id: r for r in RULES if r.log is not None and r.log.kinds == ["sxid"]}
CATALOGUE = {int(code): r.id for r in SXID_RULES.values() for code in r.log.fields.get("sxid", [])}

# one line of each kind an SXid report is made of (error_nvswitch.c, intr_nvswitch.h)
VARIANTS = {
    "Fatal": "{code}, Fatal, Link 12 some error (First)",
    "Severity 1": "{code}, Severity 1 Engine instance 12 Sub-engine instance 00",
    "Non-fatal": "{code}, Non-fatal, Link 12 some error (First)",
    "Correctable": "{code}, Correctable, Link 12 some error",
    "Severity 0": "{code}, Severity 0 Engine instance 12 Sub-engine instance 00",
    "Data": "{code}, Data {{0x00000001, 0x00000000, 0x00000000, 0x00000000}}",
    "bare": "{code}",  # a line cut after its code
}
FATAL = ("Fatal", "Severity 1")
NOT_CATALOGUED = (20009, 20035, 28006, 99999, 120280)  # 120280: 12028 followed by a digit is another code


def expected_rule(code: int, variant: str) -> str:
    """The catalogue's node actions decide whatever the line says; else a Fatal line takes the node out; else the
    catalogue; else the driver's word, and a line without one is only reported."""
    listed = CATALOGUE.get(code)
    if listed in ("nvswitch-sxid-reboot", "nvswitch-sxid-ticket"):
        return listed
    if variant in FATAL:
        return "nvswitch-sxid-fatal"
    if listed:
        return listed
    return "nvswitch-sxid-unknown" if variant in ("Data", "bare") else "nvswitch-sxid-nonfatal"


def rules_for(code: int, text: str) -> list[str]:
    event = {"id": 1, "node": "node1", "ts": 1000.0, "source": "log", "kind": "sxid", "severity": "error",
             "message": f"nvidia-nvswitch0: SXid (PCI:0000:05:00.0): {text}", "fields": {"sxid": code}}
    return sorted(f.rule_id for f in evaluate(RULES, now=1001.0, events=[event]))


def test_each_code_sits_in_one_rule_and_the_catalogue_is_the_guides():
    listed = [int(c) for r in SXID_RULES.values() for c in r.log.fields.get("sxid", [])]
    assert len(listed) == len(set(listed)) == 92
    assert {code: CATALOGUE[code] for code in (12028, 24007, 20034, 23001, 12020, 19084, 10003, 11004, 22012, 10004,
                                               20012, 22013, 11012, 20001)} == {
        12028: "nvswitch-sxid-reboot", 24007: "nvswitch-sxid-reboot", 20034: "nvswitch-sxid-reboot",
        23001: "nvswitch-sxid-reboot", 12020: "nvswitch-sxid-reboot", 19084: "nvswitch-sxid-reboot",
        10003: "nvswitch-sxid-reboot", 11004: "nvswitch-sxid-ticket", 22012: "nvswitch-sxid-ticket",
        10004: "nvswitch-sxid-notify", 20012: "nvswitch-sxid-notify", 22013: "nvswitch-sxid-record",
        11012: "nvswitch-sxid-record", 20001: "nvswitch-sxid-record"}
    assert {r.id: r.action for r in SXID_RULES.values()} == {
        "nvswitch-sxid-reboot": "drain+reboot", "nvswitch-sxid-ticket": "drain+ticket",
        "nvswitch-sxid-notify": "notify", "nvswitch-sxid-record": "record", "nvswitch-sxid-fatal": "drain+reboot",
        "nvswitch-sxid-nonfatal": "record", "nvswitch-sxid-unknown": "notify"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_line_of_every_code_gets_exactly_one_sxid_rule(variant):
    """Over the whole catalogue and codes outside it: the fallback rules' code lists agree with the catalogue's."""
    wrong = {code: got for code in [*CATALOGUE, *NOT_CATALOGUED]
             if (got := rules_for(code, VARIANTS[variant].format(code=code))) != [expected_rule(code, variant)]}
    assert wrong == {}


def test_a_code_nobody_documented_never_drains_without_the_drivers_fatal_word():
    for code in NOT_CATALOGUED:
        for variant, text in VARIANTS.items():
            actions = {SXID_RULES[r].action for r in rules_for(code, text.format(code=code))}
            assert ("drain+reboot" in actions) == (variant in FATAL), (code, variant, actions)


def act(tmp_path, line: str) -> tuple[list[str], list[str]]:
    """(event kinds, actions) for one line written as published, read by the sidecar's kernel section."""
    path = tmp_path / "kern.log"
    path.write_text(line + "\n")
    events, findings = act_on_file(RULES, SECTIONS, path)
    return [e["kind"] for e in events], sorted({f.action for f in findings})


# Real lines the catalogue's actions were chosen on (the fallback and its examples).
TUNING = [
    # https://github.com/NVIDIA/nvtrust/issues/124 (H100, protected PCIe mode; 22013 can be ignored)
    ("[   38.178720] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt",
     "record"),
    ("[   38.180708] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance 44 Sub-engine "
     "instance 00", "record"),
    ("[   38.175561] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Data {0x0000002b, 0x0000002b, 0x00000000, "
     "0x0000002b, 0x80005302, 0x00000000, 0x00000000, 0x00000000, 0x00000000}", "record"),
    # https://github.com/leptonai/gpud/blob/main/components/accelerator/nvidia/sxid/README.md (beside an Xid 79)
    ("[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
     "drain+reboot"),
    ("[6781753.404848] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 Sub-engine "
     "instance 00", "drain+reboot"),
    ("[6781753.406566] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000, "
     "0x10000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}", "drain+reboot"),
    # https://github.com/leptonai/gpud/blob/main/components/accelerator/nvidia/sxid/sxid_test.go (12028: the
    # driver's Non-fatal, the guide's restart)
    ("[111111111.111] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV "
     "error (First)", "drain+reboot"),
    # https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html (the guide's example report,
    # its time stamps elided as "[...]", here as dmesg prints them; 28006 is not in its tables)
    ("[ 4242.000001] nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 MC TS crumbstore MCTO (First)",
     "record"),
    ("[ 4242.000003] nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Data {0x00140004, 0x00100000, 0x00140004, 0x00000000, "
     "0x00000000, 0x00000000, 0x00000000, 0x00000000}", "notify"),
]

# Real lines held apart: their actions were written down before the catalogue was, and they were run once it was.
HELD_APART = [
    # https://github.com/vllm-project/vllm/issues/40652 (8x A100 SXM4 on Talos, NVLink crash; Xid 62 and 45 follow)
    ("192.168.11.119: kern: err: [2026-04-22T21:25:20.466440686Z]: nvidia-nvswitch1: SXid (PCI:0000:aa:00.0): 24007, "
     "Severity 1 Engine instance 12 Sub-engine instance 00", "drain+reboot"),
    ("192.168.11.119: kern: err: [2026-04-22T21:25:20.500049682Z]: nvidia-nvswitch1: SXid (PCI:0000:aa:00.0): 24007, "
     "Data {0x10000000, 0x10008100, 0x10000000, 0x10008100, 0x00000000, 0x00000000, 0x00000000, 0x00000000, "
     "0x00000000}", "drain+reboot"),
    # https://access.redhat.com/solutions/6619941, as quoted in leptonai/gpud's sxid tests
    ("[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
     "drain+reboot"),
    ("[131453.740754] nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Severity 1 Engine instance 30 Sub-engine "
     "instance 00", "drain+reboot"),
    ("[131453.740758] nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Data {0x50610002, 0x10100030, 0x00000000, "
     "0x10100030, 0x00000000, 0x00000000, 0x00000000, 0x00000000}p", "drain+reboot"),
    # https://github.com/leptonai/gpud/pull/338 (dmesg -x; the corpus's fifth held-out part)
    ("kern  :err   : 2025-01-25T10:34:54,859532+00:00 nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data "
     "{0x000001c0, 0x00bd5c8a, 0x00000500, 0x00000064, 0x00000000, 0x40008000, 0x5a001100, 0x00000000, 0x00000000}",
     "drain+reboot"),
]


@pytest.mark.parametrize("line,action", TUNING + HELD_APART)
def test_real_sxid_lines_get_the_action_an_admin_wants(tmp_path, line, action):
    assert act(tmp_path, line) == (["sxid"], [action])


@pytest.mark.parametrize("line", [
    "nvidia-nvswitch0: SXid (invalid): some error",  # no PCI address: not the driver's format
    "fabricmanager: see SXid (PCI:0000:05:00.0): 12028, Non-fatal in the guide",  # another writer quoting one
])
def test_look_alikes_make_no_sxid_event_and_no_action(tmp_path, line):
    kinds, actions = act(tmp_path, f"[ 1108.858286] {line}")
    assert "sxid" not in kinds and actions == []


def test_the_event_keeps_the_drivers_verdict_where_the_line_states_it(tmp_path):
    def fields(line):
        (tmp_path / "kern.log").write_text(line + "\n")
        return act_on_file(RULES, SECTIONS, tmp_path / "kern.log")[0][0]["fields"]

    verdict = fields(TUNING[3][0])
    assert (verdict["sxid"], verdict["sxid_severity"], verdict["link"]) == (20034, "Fatal", 48)
    assert fields(TUNING[4][0])["sxid_severity_level"] == 1 and fields(TUNING[4][0])["engine_instance"] == 60
    assert "sxid_severity" not in fields(TUNING[5][0])  # a Data line
