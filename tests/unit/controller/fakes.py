"""An in-memory SLURM for unit tests of decision logic (the real one is exercised in tests/integration)."""

from __future__ import annotations

import dataclasses
import time

from sigma.slurm.command import SlurmError
from sigma.slurm.types import AccountingRecord, Job, Node


class FakeSlurm:
    def __init__(self, nodes=("node1", "node2", "node3", "node4")):
        self.node_map = {n: Node(name=n, state="idle", cpus=2) for n in nodes}
        self.job_map: dict[int, Job] = {}
        self.records: dict[int, AccountingRecord] = {}
        self.res: set[str] = set()
        self.calls: list[tuple] = []
        self.next_id = 100
        self.fail_next: str | None = None

    def _call(self, *args):
        self.calls.append(args)
        if self.fail_next == args[0]:
            self.fail_next = None
            raise SlurmError([args[0]], 1, "injected failure")

    # queries
    def nodes(self):
        return list(self.node_map.values())

    def node(self, name):
        return self.node_map[name]

    def jobs(self, ids=()):
        return [j for j in self.job_map.values() if not ids or j.job_id in ids]

    def job(self, job_id):
        return self.job_map.get(job_id)

    def accounting(self, job_ids=(), since=None, duplicates=False):
        return [r for j, r in self.records.items() if not job_ids or j in job_ids]

    # helpers for tests
    def run_job(self, job_id, nodes, start=None):
        self.job_map[job_id] = Job(job_id=job_id, name=f"job{job_id}", state="RUNNING", nodes=tuple(nodes),
                                   start_time=int(start or time.time()))
        for n in nodes:
            self.set_node(n, state="allocated", alloc_cpus=2)

    def set_node(self, name, **changes):
        self.node_map[name] = dataclasses.replace(self.node_map[name], **changes)

    def set_job(self, job_id, **changes):
        self.job_map[job_id] = dataclasses.replace(self.job_map[job_id], **changes)

    def count(self, verb):
        return sum(1 for c in self.calls if c[0] == verb)

    # actions
    def drain(self, nodes, reason):
        self._call("drain", tuple(nodes), reason)
        for n in nodes:
            self.set_node(n, flags=tuple(set(self.node_map[n].flags) | {"DRAIN"}),
                          reason=reason if reason.startswith("sigma:") else f"sigma: {reason}")

    def resume(self, nodes, force=False):
        self._call("resume", tuple(nodes))
        for n in nodes:
            if self.node_map[n].reason and not self.node_map[n].drained_by_sigma and not force:
                raise SlurmError(["scontrol"], 0, "refusing to resume: their drain reason was not set by sigma")
            self.set_node(n, state="idle", flags=(), reason="")

    def set_down(self, nodes, reason):
        """As slurmctld: the node DOWN (a DRAIN flag stays), a job still running there requeued."""
        self._call("set_down", tuple(nodes), reason)
        for n in nodes:
            self.set_node(n, state="down", alloc_cpus=0,
                          reason=reason if reason.startswith("sigma:") else f"sigma: {reason}")
            for j in list(self.job_map.values()):
                if n in j.nodes and j.state == "RUNNING":  # SLURM's own requeue: not a call of ours
                    self.set_job(j.job_id, state="PENDING", reason="BeginTime", restarts=j.restarts + 1, nodes=())
                elif n in j.nodes and j.state == "COMPLETING":  # a requeued job waiting for the silent node
                    self.set_job(j.job_id, state="PENDING", reason="BeginTime", nodes=())

    def reboot(self, nodes, next_state="DOWN", reason="", asap=True):
        self._call("reboot", tuple(nodes))
        for n in nodes:
            self.set_node(n, flags=tuple(set(self.node_map[n].flags) | {"REBOOT_REQUESTED"}))

    def finish_reboot(self, node, now):
        self.set_node(node, state="down", flags=("DRAIN",), slurmd_start_time=int(now) + 1,
                      reason=self.node_map[node].reason + " reboot complete")

    def requeue(self, job_id, hold=False):
        self._call("requeue", job_id)
        j = self.job_map[job_id]
        self.set_job(job_id, state="PENDING", reason="BeginTime", restarts=j.restarts + 1, nodes=())
        for n in j.nodes:
            self.set_node(n, state="idle", alloc_cpus=0)

    def start_now(self, job_id):
        self._call("start_now", job_id)
        self.set_job(job_id, reason="None")

    def release(self, job_id):
        self._call("release", job_id)

    def cancel(self, job_id, signal=None):
        self._call("cancel", job_id)
        self.set_job(job_id, state="CANCELLED")

    def reservations(self):
        return sorted(self.res)

    def create_reservation(self, name, nodes, duration_min=60, users="root", flags=""):
        self._call("create_reservation", name)
        self.res.add(name)

    def delete_reservation(self, name):
        self._call("delete_reservation", name)
        self.res.discard(name)

    def submit(self, script, *args, wrap=None, script_args=()):
        self._call("submit", str(script), args)
        self.next_id += 1
        name = next(a.split("=", 1)[1] for a in args if a.startswith("--job-name="))
        self.job_map[self.next_id] = Job(job_id=self.next_id, name=name, state="RUNNING")
        return self.next_id

    def finish_job(self, job_id, rc=0):
        j = self.job_map.pop(job_id)
        self.records[job_id] = AccountingRecord(job_id=job_id, name=j.name, state="COMPLETED" if rc == 0 else "FAILED",
                                                return_code=rc)
