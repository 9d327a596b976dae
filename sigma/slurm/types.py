"""Typed results of SLURM queries, the same for the same cluster state on every Slurm sigma knows (22.05 to 26.05).

The JSON each version prints is read by its format family in sigma/slurm/formats/."""

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

    def started_since(self, ts: float) -> bool:
        """slurmd (or the host) started at or after ts. SLURM keeps whole seconds, so a start within ts's own second
        counts: a reboot can take less than a second, and a start stamped 12 for one at 12.4 is no earlier one."""
        return max(self.slurmd_start_time, self.boot_time) >= int(ts)

    @property
    def available(self) -> bool:
        """Schedulable: up, responding, not drained, not waiting for a reboot."""
        return self.responding and not self.drained and "REBOOT_REQUESTED" not in self.flags


@dataclass(frozen=True)
class Job:
    job_id: int
    name: str
    state: str  # as squeue prints it: PENDING, RUNNING, COMPLETING (also a requeued job not yet pending), ...
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


@dataclass(frozen=True)
class AccountingRecord:
    """One sacct record: a job run (a requeued job has one per run with --duplicates)."""

    job_id: int
    name: str
    state: str  # as sacct prints it: COMPLETED, FAILED, REQUEUED (a run that was requeued), ...
    nodes: tuple[str, ...] = ()
    submit_time: int = 0
    start_time: int = 0
    end_time: int = 0
    elapsed_s: int = 0
    return_code: int | None = None  # the batch script's exit code; None when it was killed by a signal
    exit_status: str = ""  # SUCCESS, ERROR, SIGNALED, ...
    signal: int | None = None  # the signal that ended it, if one did
    steps: tuple[str, ...] = field(default=())  # step ids without the job id: batch, extern, 0, ...


# The order in which Slurm's job_state_string() names a job state whose flags are set: the state squeue prints.
JOB_STATE_FLAG_ORDER = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED",
                        "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING")


def job_state_name(states: tuple[str, ...]) -> str:
    """One name for a job state given as a base state and flags (["PENDING", "COMPLETING"] -> COMPLETING)."""
    for flag in JOB_STATE_FLAG_ORDER:
        if flag in states:
            return flag
    return states[0] if states else ""


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
