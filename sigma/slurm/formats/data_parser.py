"""Slurm 23.02 to 26.05's JSON (data_parser v0.0.39 to v0.0.45): per-node records from `scontrol show nodes
--json`, numbers as {set, infinite, number}, states as lists (["IDLE", "DRAIN"], ["PENDING", "COMPLETING"]), an
exit code's status a list, a step id `2.batch`."""

from __future__ import annotations

from sigma.slurm.formats import FamilyBase
from sigma.slurm.formats.fields import Record, SlurmFormatError
from sigma.slurm.types import job_state_name

NODE_BASE_STATES = ("UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE")


class Family(FamilyBase):
    name = "data_parser"
    parsers = tuple(f"data_parser/v0.0.{v}" for v in range(39, 46))
    nodes_argv = ("scontrol", "show", "nodes", "--json")
    jobs_argv = ("squeue", "--json", "--states=all")  # without --states finished jobs are left out

    def node_state(self, r: Record) -> tuple[str, tuple[str, ...]]:
        states = r.strs("state", default=...)
        base = [s for s in states if s in NODE_BASE_STATES]
        if len(base) != 1:
            raise SlurmFormatError(r.source, f"{r.path}.state", f"as {list(states)}, with no single base state "
                                                                f"({', '.join(NODE_BASE_STATES)})")
        return base[0].lower(), tuple(s for s in states if s != base[0])

    def job_state(self, r: Record) -> str:
        return job_state_name(r.strs("job_state", default=...))

    def run_state(self, state: Record) -> str:
        return job_state_name(state.strs("current", default=...))

    def exit_code(self, ec: Record) -> tuple[str, int | None]:
        status = ec.strs("status")
        return (status[0] if status else ""), ec.record("signal", default={}).int("id", default=None)

    def step_id(self, step: Record, job_id: int) -> str:
        """`2.batch` -> `batch`, `2.0` -> `0`: the id within the job, as 22.05 prints it."""
        prefix, sid = f"{job_id}.", step.ident("id", default=...)
        return sid[len(prefix):] if sid.startswith(prefix) else sid
