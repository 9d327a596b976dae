"""A simulated SLURM: the same calls as `sigma.slurm.Slurm`, answered from memory on the simulation's virtual
clock, with the behaviour the controller depends on (observed on Slurm 22.05, DESIGN.md):

- a requeued job goes PENDING with a BeginTime about two minutes ahead (`start_now` clears it) while its old
  processes get KillWait seconds to end (the nodes stay allocated, COMPLETING, until then);
- `scontrol reboot ASAP nextstate=DOWN` waits until the node is idle, reboots it, and the node comes back DOWN
  (drained, our reason kept) with a new slurmd start time;
- a node whose slurmd stops answering is flagged NOT_RESPONDING after SLURM's ping, and set DOWN with reason
  "Not responding" after SlurmdTimeout (or at once by `scontrol update State=DOWN`), its jobs requeued (BeginTime
  again);
- reservations keep user jobs off a node; a validation job submitted into one runs there and ends COMPLETED or
  FAILED in accounting.

The engine (sigma.simulate.engine) owns time and tells this class what the hardware does.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
from dataclasses import dataclass, field

from sigma.slurm.client import REQUEUE_SETTLE_S, sigma_reason
from sigma.slurm.command import SlurmError
from sigma.slurm.types import AccountingRecord, Job, Node

REQUEUE_BEGIN_S = 120.0  # SLURM's BeginTime on a requeued job ("about two minutes", DESIGN.md)
KILL_WAIT_S = 30.0  # slurm.conf KillWait default: SIGTERM, then SIGKILL after this long
SLURMD_TIMEOUT_S = 300.0  # slurm.conf SlurmdTimeout default: a silent node is set DOWN and its jobs requeued
CPUS = 64  # per simulated node (what alloc_cpus reports)


@dataclass
class SimJob:
    job_id: int
    name: str
    nodes_needed: int
    work_s: float | None  # productive seconds to finish (None: runs until the end of the simulation)
    checkpoint_s: float
    restart_s: float  # from (re)start to the first training step (launch, load the checkpoint)
    submit_time: float
    validation_of: str | None = None  # a validation job: the node it checks
    reservation: str | None = None
    state: str = "PENDING"
    reason: str = "None"
    nodes: tuple[str, ...] = ()
    restarts: int = 0
    begin_at: float = 0.0
    requeued_at: float = 0.0
    start_time: float = 0.0
    end_time: float = 0.0
    run: int = 0  # incremented per start: stale events of an older run are ignored
    saved_s: float = 0.0  # productive seconds kept in checkpoints
    runs: list[dict] = field(default_factory=list)  # one per run, for the figures
    shown: Job | None = field(default=None, repr=False)  # squeue's line, until SimSlurm.jobs_changed(this job)

    def view(self) -> Job:
        if self.shown is None:
            self.shown = self._line()
        return self.shown

    def _line(self) -> Job:
        return Job(job_id=self.job_id, name=self.name, state=self.state, reason=self.reason, nodes=self.nodes,
                   restarts=self.restarts, submit_time=int(self.submit_time), start_time=math.ceil(self.start_time),
                   end_time=int(self.end_time), requeue=self.validation_of is None)


class SimSlurm:
    """Answers the controller's queries and applies its actions; `engine` is told about each change."""

    def __init__(self, names: list[str], engine):
        self.engine = engine
        self.node_map = {n: Node(name=n, state="idle", cpus=CPUS, partitions=("gpu",)) for n in names}
        self.job_map: dict[int, SimJob] = {}  # every job ever, for the figures
        self.live: dict[int, SimJob] = {}  # those not DONE: what queries and the scheduler walk
        self.records: dict[int, AccountingRecord] = {}
        self._ended: list[tuple[int, int]] = []  # (end time, job id) of the records, in the order they ended
        self.res: dict[str, str] = {}  # reservation -> node
        self.reserved: dict[str, str] = {}  # node -> reservation
        self.next_id = 1
        self.calls = 0
        self._nodes_cache: list[Node] | None = None
        self._jobs_cache: list[Job] | None = None  # squeue's answer until the engine says something changed
        self.version = 0  # bumped on every node or reservation change
        # kept up to date on every change rather than counted over the whole cluster at each event
        self.available = len(names)  # nodes in service outside a reservation
        self.allocated = 0  # ... running a job
        self.free = set(names)  # nodes a job may start on: in service, nothing running (reserved or not)
        self.not_responding: set[str] = set()  # nodes flagged NOT_RESPONDING (few, against the whole cluster)
        self.position = {n: i for i, n in enumerate(names)}  # sinfo's order

    # ---------- queries ----------
    def nodes(self) -> list[Node]:
        if self._nodes_cache is None:
            self._nodes_cache = list(self.node_map.values())
        return self._nodes_cache

    def node(self, name: str) -> Node:
        if name not in self.node_map:
            raise SlurmError(["scontrol", "show", "node"], 1, f"Node {name} not found")
        return self.node_map[name]

    def jobs(self, job_ids=()) -> list[Job]:
        if job_ids:
            ids = set(job_ids)
            return [j.view() for j in self.live.values() if j.job_id in ids]
        if self._jobs_cache is None:
            self._jobs_cache = [j.view() for j in self.live.values()]
        return self._jobs_cache

    def job(self, job_id: int) -> Job | None:
        j = self.live.get(int(job_id))
        return j.view() if j is not None else None

    def accounting(self, job_ids=(), since=None, duplicates=False) -> list[AccountingRecord]:
        """sacct: the given jobs' records, or those that ended at or after `since` (sacct --starttime, local
        time): looked up, not walked, since the records grow with every validation over years."""
        if job_ids:
            return [self.records[j] for j in job_ids if j in self.records]
        first = 0 if since is None else bisect.bisect_left(
            self._ended, time.mktime(time.strptime(since, "%Y-%m-%dT%H:%M:%S")), key=lambda e: e[0])
        return [self.records[j] for _, j in self._ended[first:]]

    def record(self, rec: AccountingRecord) -> None:
        """A job ended (the engine's clock only moves forward: the list stays in end-time order)."""
        if rec.job_id not in self.records:
            self._ended.append((rec.end_time, rec.job_id))
        self.records[rec.job_id] = rec

    def reservations(self) -> list[str]:
        return sorted(self.res)

    # ---------- node actions ----------
    def set_node(self, name: str, **changes) -> None:
        old = self.node_map[name]
        n = self.node_map[name] = dataclasses.replace(old, **changes)
        self._nodes_cache = None
        self.version += 1
        if name not in self.reserved:
            self.available += n.available - old.available
            self.allocated += bool(n.alloc_cpus) - bool(old.alloc_cpus)
        if n.available and not n.alloc_cpus:
            self.free.add(name)
        else:
            self.free.discard(name)
        if "NOT_RESPONDING" in n.flags:
            self.not_responding.add(name)
        else:
            self.not_responding.discard(name)
        if name in self.engine.tl.open:  # a fault's timeline runs until the node is back in service
            self.engine.tl.service(name, n.available and name not in self.reserved)

    def add_flag(self, name: str, flag: str) -> None:
        self.set_node(name, flags=tuple(sorted(set(self.node_map[name].flags) | {flag})))

    def drop_flag(self, name: str, flag: str) -> None:
        self.set_node(name, flags=tuple(f for f in self.node_map[name].flags if f != flag))

    def drain(self, nodes, reason: str) -> None:
        self.calls += 1
        for n in nodes:
            self.node(n)
            self.add_flag(n, "DRAIN")
            self.set_node(n, reason=sigma_reason(reason), reason_time=int(self.engine.now))
        self.engine.changed()

    def admin_drain(self, node: str, reason: str) -> None:
        """An admin's `scontrol update state=drain reason=...` (no sigma prefix)."""
        self.add_flag(node, "DRAIN")
        self.set_node(node, reason=reason, reason_time=int(self.engine.now))
        self.engine.changed()

    def resume(self, nodes, *, force: bool = False) -> None:
        self.calls += 1
        for n in nodes:
            cur = self.node(n)
            if cur.reason and not cur.drained_by_sigma and not force:
                raise SlurmError(["scontrol", "update", "State=RESUME"], 0,
                                 f"refusing to resume {[n]}: their drain reason was not set by sigma")
            if "NOT_RESPONDING" in cur.flags:
                continue  # SLURM keeps a silent node down whatever it is told
            state = "allocated" if cur.alloc_cpus else "idle"
            self.set_node(n, state=state, reason="", flags=tuple(f for f in cur.flags if f not in ("DRAIN",)))
        self.engine.changed()

    def set_down(self, nodes, reason: str) -> None:
        """`scontrol update State=DOWN`: what SlurmdTimeout does, at once (the DRAIN flag and the reason stay)."""
        self.calls += 1
        for n in nodes:
            self.node(n)
            self.set_node(n, state="down", reason=sigma_reason(reason), reason_time=int(self.engine.now))
            self.engine.node_down(n)
        self.engine.changed()

    def reboot(self, nodes, *, next_state: str = "DOWN", reason: str = "", asap: bool = True) -> None:
        self.calls += 1
        for n in nodes:
            self.add_flag(n, "REBOOT_REQUESTED")
            if reason:
                self.set_node(n, reason=sigma_reason(reason))
            self.engine.reboot_requested(n)
        self.engine.changed()

    # ---------- job actions ----------
    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        self.calls += 1
        j = self.job_map[int(job_id)]
        if j.state not in ("RUNNING", "CONFIGURING"):
            raise SlurmError(["scontrol", "requeue", str(job_id)], 1, f"Job {job_id} is not running ({j.state})")
        self.engine.requeue(j, hold=hold)

    def start_now(self, job_id: int, requeued_at: float | None = None) -> None:
        self.calls += 1
        j = self.job_map[int(job_id)]
        if j.state == "PENDING":
            # the real client waits REQUEUE_SETTLE_S after the requeue (a relaunch in the same second is killed)
            j.begin_at = max(self.engine.now, j.requeued_at + REQUEUE_SETTLE_S)
            j.reason = "None"
            self.jobs_changed(j)
            self.engine.at(j.begin_at, self.engine.due)
            self.engine.changed()

    def release(self, job_id: int) -> None:
        j = self.job_map[int(job_id)]
        if j.state == "PENDING":
            j.reason = "None"
            self.jobs_changed(j)
            self.engine.changed()

    def cancel(self, job_id: int, signal: str | None = None) -> None:
        self.calls += 1
        self.engine.cancel(self.job_map[int(job_id)])

    def create_reservation(self, name: str, nodes, *, duration_min: int = 60, users: str = "root",
                           flags: str = "") -> None:
        self.calls += 1
        for n in nodes:
            self.res[name] = n
            self._count_reserved(n, name)
            self.add_flag(n, "MAINTENANCE")
        self.engine.changed()

    def delete_reservation(self, name: str) -> None:
        self.calls += 1
        node = self.res.pop(name, None)
        if node is not None:
            self._count_reserved(node, None)
            self.drop_flag(node, "MAINTENANCE")
        self.engine.changed()

    def _count_reserved(self, node: str, reservation: str | None) -> None:
        """A node enters (or leaves) a reservation: out of (back in) the counts of nodes in service."""
        was = node in self.reserved
        if reservation is None:
            self.reserved.pop(node, None)
        else:
            self.reserved[node] = reservation
        if was != (reservation is not None):
            n, sign = self.node_map[node], -1 if reservation is not None else 1
            self.available += sign * n.available
            self.allocated += sign * bool(n.alloc_cpus)
        self.version += 1

    def submit(self, script, *sbatch_args: str, wrap=None, script_args=()) -> int:
        """Only validation jobs are submitted by the controller: `--reservation=R -w NODE --job-name=N`."""
        self.calls += 1
        args = list(sbatch_args)
        opts = dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)
        node = args[args.index("-w") + 1] if "-w" in args else None
        if node is None or node not in self.node_map:
            raise SlurmError(["sbatch"], 1, f"sbatch: error: invalid node name {node!r}")
        job = self.new_job(opts.get("--job-name", "validate"), 1, None, 0.0, 0.0)
        job.validation_of, job.reservation = node, opts.get("--reservation")
        self.engine.changed()
        return job.job_id

    def new_job(self, name: str, nodes: int, work_s: float | None, checkpoint_s: float, restart_s: float) -> SimJob:
        job = SimJob(self.next_id, name, nodes, work_s, checkpoint_s, restart_s, self.engine.now)
        job.begin_at = self.engine.now
        self.job_map[job.job_id] = self.live[job.job_id] = job
        self.next_id += 1
        self.jobs_changed(job)
        return job

    def retire(self, job: SimJob) -> None:
        """The job has left squeue for good (a finished validation job)."""
        job.state = "DONE"
        del self.live[job.job_id]
        self.jobs_changed(job)

    def jobs_changed(self, job: SimJob) -> None:
        """The job's state, reason, nodes or times changed: its line, and squeue's answer, are built again when next
        asked (the other jobs' lines are kept: a thousand-node cluster's hundred jobs, at every change)."""
        job.shown = None
        self._jobs_cache = None
