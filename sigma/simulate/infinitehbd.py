"""StepFun's InfiniteHBD fault trace as published (github.com/stepfun-ai/InfiniteHBD-Trace, Apache-2.0; SIGCOMM'25):
`fault_trace.json`, a JSON array of `{node_id, event_time (days), event_type fault_start|fault_end, fault_type
{Level, Class, Desc}}` from 400 GPU servers of an LLM pre-training cluster over 348 days from 2024-03-30.

Each fault_start is paired with the next fault_end of the same node and fault type (else the node's oldest open
fault); node ids become node0001... in order of first appearance. Each fault type maps to the fault kind that
shows it the way Sigma would see it and repairs it the way its description says (FAULT_KINDS); a fault type not
in the table is a bad record (what the reader does not understand it does not guess).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from sigma.simulate.trace import BadRows, Outage, TraceError

DAY0 = dt.datetime(2024, 3, 30, tzinfo=dt.timezone.utc).timestamp()  # the README's first day of the trace

# (Class, Desc) -> kind (sigma.simulate.faults.KINDS). The reason for each is the fault's own description: what a
# node shows (a kernel-log line, a silent slurmd, only a slower job, nothing Sigma reads) and what repairs it
# (a reboot, or hands on the hardware, which keeps the recorded outage as its time).
FAULT_KINDS = {
    ("GPU", "GPU xid Error"): "xid",
    ("GPU", "GPU Lost"): "xid",  # fallen off the bus (Xid 79: restart the machine)
    ("GPU", "GPU device not found"): "xid",
    ("GPU", "GPU device unknow error"): "xid",  # nvidia-smi's "Unknown Error": a GPU that fell off the bus
    ("GPU", "nvidia-smi Timeout"): "xid",  # NVML unresponsive: a reboot
    ("GPU", "GPU DBE(Double Bit ECC) > Threshold"): "gpu-memory",  # retirements past the limit: a new GPU
    ("GPU", "GPU SBE(Single Bit ECC) > Threshold"): "gpu-memory",
    ("GPU", "Silent Data Corruption"): "health",  # only a test shows it; the GPU is replaced
    ("GPU", "GPU PCI link width low"): "slow-part",  # the GPU works, slower: reseat or replace
    ("GPU", "GPU P2P Bandwidth Low"): "slow-part",
    ("GPU", "GPU Temperature High"): "slow-part",  # throttled clocks until the cooling is fixed
    ("Parameter Plane Cable", "Link Down"): "network",
    ("NIC", "NIC Lost"): "network",
    ("NIC", "NIC Link Speed low"): "slow-part",
    ("NIC", "NIC PCI link Width low"): "slow-part",
    ("NIC", "Rnic Gid Error"): "software",  # the RDMA NIC's GID table: a driver reload or reboot
    ("Power Supply", "Power Supply Failure detected"): "people",  # BMC sensors: Sigma reads none
    ("Power Supply", "Redundancy Lost"): "people",
    ("Fan", "Speed Critical (Sensor)"): "people",
    ("Fan", "Redundancy Lost"): "people",
    ("Motherboard Battery", "Low"): "people",
    ("RAID Card", "Bus Correctable error"): "people",
    ("Motherboard", "Motherboard Failed"): "node-death",
    ("Riser Card", "RiserCard Fault"): "node-death",
    ("CPU", "Machine Check Exception ( Uncorrectable )"): "cpu",
    ("CPU", "Configuration Error"): "people",  # BIOS settings: hands-on work Sigma has no signal for
    ("File System", "FS Readonly"): "software",
    ("File System", "FS: Multiple Disk FS Error"): "software",
    ("Software Tool", "Kubelet Date Absent"): "software",  # the node agent stopped reporting: restarted
    ("Operating System", "Kernel Panic"): "software",
    ("Firmware", "Firmware mismatch"): "people",  # a firmware update: planned hands-on work
    ("Other Failures", "Unknown Error"): None,  # hardware or software by its Level (LEVEL_KINDS)
    ("Unknown Error", "Unknown Error"): "node-death",  # undetermined: the node went away (as LANL's)
    ("System Crash", "Server down"): "node-death",
    ("Stress Test Failure", "Unknown Error"): "health",  # the site's stress test rejected the node
    ("Training Task Troubleshooting", "Suspect Machine Offline"): "straggler",  # found through a job
    ("Change", "Y-cables Taken offline"): "people",  # planned work
    ("Change", "Remote Optical Module Failure"): "people",
    ("Test", "Temporarily Offline"): "people",
}
LEVEL_KINDS = {"Hardware Failure": "node-death", "Software Failure": "software"}  # "Other Failures" by Level


def fault_kind(level: str, cls: str, desc: str) -> str | None:
    if (cls, desc) not in FAULT_KINDS:
        return None
    return FAULT_KINDS[(cls, desc)] or LEVEL_KINDS.get(level)


def looks_like(path: str | Path) -> bool:
    """A JSON array (the published layout) rather than a CSV."""
    with open(path, "rb") as f:
        return f.read(64).lstrip()[:1] == b"["


def read(path: str | Path, bad: BadRows | None = None) -> tuple[list[Outage], list[str]]:
    """(outages, node ids in the order they were numbered: node0001 is the first)."""
    path = Path(path)
    bad = bad or BadRows()
    nodes: dict[str, int] = {}
    open_faults: dict[str, list[tuple[float, tuple, str]]] = {}  # node id -> (start, fault type, origin)
    out: list[Outage] = []
    for line, rec in _records(path):
        where = f"{path}:{line}"
        try:
            node, t, event, ftype = _fields(rec, where)
        except TraceError as exc:
            bad(str(exc))
            continue
        if event == "fault_start":
            if fault_kind(*ftype) is None:
                bad(f"{where}: fault_type {dict(zip(('Level', 'Class', 'Desc'), ftype))} is not one this reader "
                    f"knows (sigma/simulate/infinitehbd.py FAULT_KINDS)")
                continue
            nodes.setdefault(node, len(nodes))
            open_faults.setdefault(node, []).append((t, ftype, where))
            continue
        pending = open_faults.get(node) or []
        match = next((p for p in pending if p[1] == ftype), pending[0] if pending else None)
        if match is None:
            bad(f"{where}: fault_end of node {node} without a fault_start before it")
            continue
        pending.remove(match)
        start, (level, cls, desc), origin = match
        if t < start:
            bad(f"{where}: event_time {t} is before its fault_start at {origin}")
            continue
        out.append(Outage(nodes[node], DAY0 + start * 86400.0, DAY0 + t * 86400.0, fault_kind(level, cls, desc),
                          origin, f"{cls}: {desc}"))
    for node, pending in open_faults.items():  # never ended: no recorded repair
        for start, (level, cls, desc), origin in pending:
            out.append(Outage(nodes[node], DAY0 + start * 86400.0, None, fault_kind(level, cls, desc), origin,
                              f"{cls}: {desc}"))
    return sorted(out, key=lambda o: (o.start, o.node)), list(nodes)


def _fields(rec, where: str) -> tuple[str, float, str, tuple[str, str, str]]:
    if not isinstance(rec, dict):
        raise TraceError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    for key in ("node_id", "event_time", "event_type", "fault_type"):
        if key not in rec:
            raise TraceError(f"{where}: missing field {key}")
    node, t, event, ftype = rec["node_id"], rec["event_time"], rec["event_type"], rec["fault_type"]
    if not isinstance(node, str) or not node:
        raise TraceError(f"{where}: node_id {node!r} is not a node id")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not t == t or t < 0:
        raise TraceError(f"{where}: event_time {t!r} is not a number of days")
    if event not in ("fault_start", "fault_end"):
        raise TraceError(f"{where}: event_type {event!r} is neither fault_start nor fault_end")
    if not isinstance(ftype, dict) or not all(isinstance(ftype.get(k), str) for k in ("Level", "Class", "Desc")):
        raise TraceError(f"{where}: fault_type {ftype!r} needs Level, Class and Desc")
    return node, float(t), event, (ftype["Level"], ftype["Class"], ftype["Desc"])


def _records(path: Path):
    """(line, record) for each element of the top-level array: bad records are named by the line they start on."""
    text = path.read_text()
    dec = json.JSONDecoder()
    i, line = _skip(text, 0), 1
    if text[i:i + 1] != "[":
        raise TraceError(f"{path}:1: not an InfiniteHBD trace: expected a JSON array of fault events")
    pos = i + 1
    while True:
        i = _skip(text, pos)
        line += text.count("\n", pos, i)
        if text[i:i + 1] == "]":
            return
        try:
            rec, end = dec.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
        yield line, rec
        line += text.count("\n", i, end)
        i = _skip(text, end)
        line += text.count("\n", end, i)
        if text[i:i + 1] == ",":
            i += 1
        elif text[i:i + 1] != "]":
            raise TraceError(f"{path}:{line}: expected ',' or ']' after a record")
        pos = i


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i
