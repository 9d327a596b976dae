"""Drain reasons that say what matters within SLURM's default `sinfo -R` width.

`sinfo -R` prints reasons as `%20E`: 20 characters, of which `sigma: ` takes 7. So the rule comes first, under a
short alias when its id is longer than the 13 characters left; the full rule id and summary follow for
`scontrol show node`, and the whole evidence is in `sigma explain` (NHC keeps its reasons short for the same reason).
"""

from __future__ import annotations

SINFO_REASON_WIDTH = 20  # Slurm 22.05 `sinfo -R` default format "%20E %9u %19H %N"
PREFIX = "sigma: "
MAX_REASON = 120  # what we keep of the summary in SLURM's reason field
SHORT_IDS = {
    "isolation-outlier": "straggler",
    "health-prolog-failed": "prolog-check",
    "health-epilog-failed": "epilog-check",
    "slurm-node-not-responding": "slurmd-silent",
    "watchdog-crash-loop": "crash-loop",
    "watchdog-throughput-drop": "throughput",
    "watchdog-below-history": "below-history",
    "watchdog-throughput-jitter": "jitter",
    "gpu-ecc-uncorrectable": "ecc-uncorr",
    "gpu-ecc-uncorrectable-log": "ecc-uncorr",
    "gpu-nvml-unresponsive": "nvml-silent",
    "gpu-count-changed": "gpu-count",
    "kernel-hung-task": "hung-task",
    "ib-port-flapping": "ib-flapping",
    "nic-lost-carrier": "lost-carrier",
    "kpi-nonfinite-loss": "nan-loss",
    "kpi-nan-loss-event": "nan-loss",
    "gpu-xid-record": "xid-record",
    "gpu-xid-repair": "xid-repair",
    "gpu-xid-restart-bm": "xid-reboot",
    "gpu-xid-restart-app": "xid-app",
    "gpu-xid-nvlink5": "xid-nvlink",
    "gpu-xid-support": "xid-support",
    "gpu-xid-mechanicals": "xid-mechanic",
    "gpu-xid-software": "xid-software",
    "gpu-fallen-off-bus": "gpu-off-bus",
    "gpu-pcie-replays": "pcie-replays",
    "gpu-driver-mismatch": "drv-mismatch",
    "gpu-reset-required": "reset-needed",
    "intel-gpu-failed": "intelgpu-fail",
    "intel-gpu-firmware": "intelgpu-fw",
    "nvswitch-sxid-fatal": "sxid-fatal",
    "nvswitch-sxid-nonfatal": "sxid-nonfatal",
    "nvswitch-sxid-reboot": "sxid-reboot",
    "nvswitch-sxid-ticket": "sxid-ticket",
    "nvswitch-sxid-notify": "sxid-notify",
    "nvswitch-sxid-record": "sxid-record",
    "nvswitch-sxid-unknown": "sxid-unknown",
    "dcgm-inforom-pages": "dcgm-inforom",
    "dcgm-pcie-thermal-power": "dcgm-pcie-pwr",
    "memory-uncorrectable": "mem-uncorr",
    "memory-corrected-storm": "mem-ce-storm",
    "cpu-machine-check": "mce",
    "filesystem-error": "fs-error",
    "md-raid-failed": "raid-failed",
    "oom-kill-cgroup": "oom-cgroup",
    "kernel-soft-lockup": "soft-lockup",
    "kernel-hard-lockup": "hard-lockup",
    "kernel-rcu-stall": "rcu-stall",
    "nccl-watchdog-timeout": "nccl-timeout",
    "nccl-system-error": "nccl-syserr",
    "ib-link-downed": "ib-link-down",
    "ib-symbol-errors": "ib-symbol-err",
    "ib-port-not-active": "ib-not-active",
    "pcie-aer-fatal": "aer-fatal",
    "pcie-aer-nonfatal": "aer-nonfatal",
    "pcie-aer-corrected-storm": "aer-ce-storm",
}


GENERIC_PREFIXES = ("gpu-", "kernel-", "health-", "watchdog-", "kpi-")  # dropped first: the rest names the fault


def short_rule(rule_id: str) -> str:
    """The rule as `sinfo -R` can show it: the id itself when it fits, else its alias, else the id without a generic
    prefix and with its longest words shortened until it fits (`gpu-xid-restart-app` -> `xid-resta-app`)."""
    room = SINFO_REASON_WIDTH - len(PREFIX)
    if len(rule_id) <= room:
        return rule_id
    if rule_id in SHORT_IDS:
        return SHORT_IDS[rule_id]
    words = rule_id.split("-")
    if words[0] == "learned":  # learned-<signature words>-<hash>: the hash tells learned rules apart
        return f"learn-{words[-1]}"[:room]
    if any(rule_id.startswith(p) for p in GENERIC_PREFIXES) and len(words) > 1:
        words = words[1:]
    while len("-".join(words)) > room and max(map(len, words)) > 3:
        longest = max(range(len(words)), key=lambda k: len(words[k]))
        words[longest] = words[longest][:-1]
    return "-".join(words)[:room]


def drain_reason(rule_id: str, summary: str) -> str:
    """`sigma: <rule or alias> [(<rule id>)] <summary>`: the first 20 characters name the rule."""
    short = short_rule(rule_id)
    head = rule_id if short == rule_id else f"{short} ({rule_id})"
    return f"{PREFIX}{head} {' '.join(summary.split())}"[:MAX_REASON]
