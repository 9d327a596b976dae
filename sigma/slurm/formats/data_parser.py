"""Slurm 23.02 to 26.05's JSON (data_parser v0.0.39 to v0.0.45): per-node records from `scontrol show nodes
--json`, numbers as {set, infinite, number}, states as lists (["IDLE", "DRAIN"], ["PENDING", "COMPLETING"]), an
exit code's status a list, a step id `2.batch`."""

from __future__ import annotations

from sigma.slurm.formats import FamilyBase
from sigma.slurm.formats.fields import Record, SlurmFormatError
from sigma.slurm.types import AccountingRecord, Job, Node, expand_hostlist, job_state_name

NODE_BASE_STATES = ("UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE")


class Family(FamilyBase):
    name = "data_parser"
    parsers = tuple(f"data_parser/v0.0.{v}" for v in range(39, 46))
    nodes_argv = ("scontrol", "show", "nodes", "--json")
    jobs_argv = ("squeue", "--json", "--states=all")  # without --states finished jobs are left out

    def node(self, r: Record) -> Node:
        states = r.strs("state", default=...)
        base = [s for s in states if s in NODE_BASE_STATES]
        if len(base) != 1:
            raise SlurmFormatError(r.source, f"{r.path}.state", f"as {list(states)}, with no single base state "
                                                                f"({', '.join(NODE_BASE_STATES)})")
        return Node(
            name=r.str("name", default=...), state=base[0].lower(), flags=tuple(s for s in states if s != base[0]),
            reason=r.str("reason"), reason_user=r.str("reason_set_by_user"), reason_time=r.int("reason_changed_at"),
            cpus=r.int("cpus"), alloc_cpus=r.int("alloc_cpus"), partitions=r.strs("partitions"),
            boot_time=r.int("boot_time"), slurmd_start_time=r.int("slurmd_start_time"),
        )

    def job(self, r: Record) -> Job:
        return Job(
            job_id=r.int("job_id", default=...), name=r.str("name"),
            state=job_state_name(r.strs("job_state", default=...)), reason=r.str("state_reason"),
            nodes=tuple(expand_hostlist(r.str("nodes"))), restarts=r.int("restart_cnt"), user=r.str("user_name"),
            user_id=r.int("user_id", default=-1), partition=r.str("partition"), submit_time=r.int("submit_time"),
            start_time=r.int("start_time"), end_time=r.int("end_time"), requeue=r.bool("requeue", default=True),
            batch_host=r.str("batch_host"), command=r.str("command"), work_dir=r.str("current_working_directory"),
            stdout=r.str("standard_output"),
        )

    def run(self, r: Record) -> AccountingRecord:
        t, ec = r.record("time", default={}), r.record("exit_code", default={})
        job_id = r.int("job_id", default=...)
        status = ec.strs("status")
        return AccountingRecord(
            job_id=job_id, name=r.str("name"),
            state=job_state_name(r.record("state", default=...).strs("current", default=...)),
            nodes=tuple(expand_hostlist(r.str("nodes"))), submit_time=t.int("submission"), start_time=t.int("start"),
            end_time=t.int("end"), elapsed_s=t.int("elapsed"), return_code=ec.int("return_code", default=None),
            exit_status=status[0] if status else "",
            signal=ec.record("signal", default={}).int("id", default=None),
            steps=tuple(_step_id(s.record("step", default=...).ident("id", default=...), job_id)
                        for s in r.records("steps", default=[])),
        )


def _step_id(step: str, job_id: int) -> str:
    """`2.batch` -> `batch`, `2.0` -> `0`: the id within the job, as 22.05 prints it."""
    prefix = f"{job_id}."
    return step[len(prefix):] if step.startswith(prefix) else step
