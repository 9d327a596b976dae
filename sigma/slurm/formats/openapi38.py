"""Slurm 22.05's JSON (openapi/v0.0.38): `sinfo --json` has one record per node, numbers are plain integers, a
node's state is a lower-case string plus `state_flags`, a job's state one string, a step id `batch`."""

from __future__ import annotations

from dataclasses import replace

from sigma.slurm.formats import FamilyBase
from sigma.slurm.formats.fields import Record, SlurmFormatError
from sigma.slurm.types import AccountingRecord


class Family(FamilyBase):
    name = "openapi/v0.0.38"
    parsers = ("openapi/v0.0.38", "openapi/dbv0.0.38")  # sacct says dbv
    nodes_argv = ("sinfo", "--json")
    jobs_argv = ("squeue", "--json")  # lists finished jobs until MinJobAge, as every version does with --states=all

    def node_state(self, r: Record) -> tuple[str, tuple[str, ...]]:
        return r.str("state", default=...).lower(), r.strs("state_flags")

    def job_state(self, r: Record) -> str:
        return r.str("job_state", default=...)

    def run_state(self, state: Record) -> str:
        return state.str("current", default=...)

    def exit_code(self, ec: Record) -> tuple[str, int | None]:
        return ec.str("status"), ec.record("signal", default={}).int("signal_id", default=None)

    def step_id(self, step: Record, job_id: int) -> str:
        return step.ident("id", default=...)  # "batch", or a number for an srun step

    def exit_codes_argv(self, json_argv) -> list[str]:
        """22.05's `sacct --json` says return_code 0, status SUCCESS for a script that exited 3, where its text
        output says ExitCode 3:0: the same query as text, one line per job run (-X), in the JSON's order."""
        return [a for a in json_argv if a != "--json"] + ["-n", "-P", "-X", "-o", "JobIDRaw,ExitCode"]

    def runs(self, records: list[Record], exit_codes_text: str | None = None) -> list[AccountingRecord]:
        runs = [self.run(r) for r in records]
        if exit_codes_text is None or not records:
            return runs
        # the k-th run of a job in one answer is its k-th in the other (a run added between the two queries, at
        # the end of its job's runs, keeps the JSON's code)
        codes: dict[str, list[int]] = {}
        for line in exit_codes_text.splitlines():
            fields = line.split("|")
            rc, _, sig = fields[-1].partition(":")
            if len(fields) != 2 or not (rc.isdigit() and sig.isdigit()):
                raise SlurmFormatError(records[0].source if records else None, "JobIDRaw|ExitCode",
                                       f"as {line!r}, not JOBID|RC:SIGNAL")
            codes.setdefault(fields[0], []).append(int(rc))
        fixed, seen = [], {}
        for run in runs:
            k = seen[run.job_id] = seen.get(run.job_id, -1) + 1
            rc = (codes.get(str(run.job_id)) or [])[k:k + 1]
            if rc and rc[0] != 0 and run.exit_status == "SUCCESS":  # as later releases report it
                run = replace(run, return_code=rc[0], exit_status="ERROR")
            fixed.append(run)
        return fixed
