"""Typed views of `sinfo --json`, `squeue --json` and `sacct --json` (Slurm 22.05+, openapi v0.0.38)."""

from __future__ import annotations

from dataclasses import dataclass, field

SIGMA_REASON_PREFIX = "sigma:"
ACTIVE_JOB_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING",
                               "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED"})


@dataclass(frozen=True)
class Node:
    name: str
    state: str  # base state: idle, allocated, mixed, down, ...
    flags: tuple[str, ...] = ()  # DRAIN, REBOOT_REQUESTED, NOT_RESPONDING, MAINTENANCE, ...
    reason: str = ""
    reason_user: str = ""
    reason_time: int = 0
    cpus: int = 0
    alloc_cpus: int = 0
    partitions: tuple[str, ...] = ()
    boot_time: int = 0
    slurmd_start_time: int = 0

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def drained_by_sigma(self) -> bool:
        """Only these may ever be resumed by us; an admin's drain is never ours to undo."""
        return self.reason.startswith(SIGMA_REASON_PREFIX)

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags and self.state != "down"

    @property
    def rebooting(self) -> bool:
        """A reboot asked for or under way: its slurmd stops on purpose."""
        return bool({"REBOOT_REQUESTED", "REBOOT_ISSUED"} & set(self.flags))

    @property
    def silent(self) -> bool:
        """slurmd stopped answering, not for a reboot, and SLURM has not set the node DOWN yet."""
        return "NOT_RESPONDING" in self.flags and self.state != "down" and not self.rebooting

    @property
    def available(self) -> bool:
        """Schedulable: up, responding, not drained, not waiting for a reboot."""
        return self.responding and not self.drained and "REBOOT_REQUESTED" not in self.flags

    @classmethod
    def from_json(cls, d: dict) -> "Node":
        return cls(
            name=d["name"], state=str(d.get("state", "")).lower(), flags=tuple(d.get("state_flags") or ()),
            reason=d.get("reason") or "", reason_user=d.get("reason_set_by_user") or "",
            reason_time=int(d.get("reason_changed_at") or 0), cpus=int(d.get("cpus") or 0),
            alloc_cpus=int(d.get("alloc_cpus") or 0), partitions=tuple(d.get("partitions") or ()),
            boot_time=int(d.get("boot_time") or 0), slurmd_start_time=int(d.get("slurmd_start_time") or 0),
        )


@dataclass(frozen=True)
class Job:
    job_id: int
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, ...
    reason: str = ""
    nodes: tuple[str, ...] = ()
    restarts: int = 0
    user: str = ""
    user_id: int = -1  # the uid the job runs as (-1: unknown)
    partition: str = ""
    submit_time: int = 0
    start_time: int = 0
    end_time: int = 0
    requeue: bool = True
    batch_host: str = ""
    command: str = ""
    work_dir: str = ""
    stdout: str = ""

    @property
    def active(self) -> bool:
        """Still holds or waits for resources (squeue also lists recently finished jobs)."""
        return self.state in ACTIVE_JOB_STATES

    @classmethod
    def from_json(cls, d: dict) -> "Job":
        return cls(
            job_id=int(d["job_id"]), name=d.get("name") or "", state=d.get("job_state") or "",
            reason=d.get("state_reason") or "", nodes=tuple(expand_hostlist(d.get("nodes") or "")),
            restarts=int(d.get("restart_cnt") or 0), user=d.get("user_name") or "",
            user_id=int(d["user_id"]) if isinstance(d.get("user_id"), int) else -1,
            partition=d.get("partition") or "", submit_time=int(d.get("submit_time") or 0),
            start_time=int(d.get("start_time") or 0), end_time=int(d.get("end_time") or 0),
            requeue=bool(d.get("requeue", True)), batch_host=d.get("batch_host") or "",
            command=d.get("command") or "", work_dir=d.get("current_working_directory") or "",
            stdout=d.get("standard_output") or "",
        )


@dataclass(frozen=True)
class AccountingRecord:
    """One sacct record: a job run (a requeued job has one per run with --duplicates)."""

    job_id: int
    name: str
    state: str
    nodes: tuple[str, ...] = ()
    submit_time: int = 0
    start_time: int = 0
    end_time: int = 0
    elapsed_s: int = 0
    return_code: int | None = None
    exit_status: str = ""
    steps: tuple[str, ...] = field(default=())

    @classmethod
    def from_json(cls, d: dict) -> "AccountingRecord":
        t = d.get("time") or {}
        ec = d.get("exit_code") or {}
        return cls(
            job_id=int(d["job_id"]), name=d.get("name") or "", state=(d.get("state") or {}).get("current", ""),
            nodes=tuple(expand_hostlist(d.get("nodes") or "")), submit_time=int(t.get("submission") or 0),
            start_time=int(t.get("start") or 0), end_time=int(t.get("end") or 0),
            elapsed_s=int(t.get("elapsed") or 0), return_code=ec.get("return_code"),
            exit_status=ec.get("status") or "",
            steps=tuple(s["step"]["id"] for s in d.get("steps") or () if "step" in s),
        )


def expand_hostlist(expr: str) -> list[str]:
    """Expand a SLURM hostlist ('node[1-3,7],gpu[001-002]') without calling scontrol; ValueError naming the part
    for a malformed one (an unclosed bracket, a range that is not numbers or runs backwards)."""
    names: list[str] = []
    for part in _split_top_level(expr):
        if "[" not in part:
            if "]" in part:
                raise ValueError(f"hostlist {expr!r}: ']' without '[' in {part!r}")
            if part and part != "(null)" and part != "None assigned":
                names.append(part)
            continue
        prefix, rest = part.split("[", 1)
        if "]" not in rest:
            raise ValueError(f"hostlist {expr!r}: '[' without ']' in {part!r}")
        ranges, suffix = rest.split("]", 1)
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not lo.isdigit() or not (hi or lo).isdigit() or int(hi or lo) < int(lo):
                raise ValueError(f"hostlist {expr!r}: {r!r} is not a range like 003-005 or a number")
            for i in range(int(lo), int(hi or lo) + 1):
                names.extend(expand_hostlist(f"{prefix}{i:0{len(lo)}d}{suffix}"))
    return names


def _split_top_level(expr: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]
