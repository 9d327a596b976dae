"""SLURM's JSON, one parser per format family, behind the same typed results (sigma.slurm.types).

- openapi/v0.0.38 (Slurm 22.05): nodes from `sinfo --json`; plain integers; a node state string plus state_flags.
- data_parser v0.0.39 to v0.0.45 (Slurm 23.02 to 26.05): nodes from `scontrol show nodes --json` (`sinfo --json`
  groups node names instead); numbers as {set, infinite, number}; states as lists of flags; finished jobs only with
  `squeue --states=all`.

The Slurm release is read once per client (`scontrol --version`, no controller needed) and picks the family; every
answer's meta must then name a data parser of that family. Anything else is a SlurmFormatError naming the release,
the command and the field.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod

from sigma.slurm.formats.fields import Record, SlurmFormatError, Source
from sigma.slurm.types import AccountingRecord, Job, Node, expand_hostlist

# Slurm's releases from the first with --json on every command sigma runs to the newest checked
KNOWN_RELEASES = ((22, 5), (23, 2), (23, 11), (24, 5), (24, 11), (25, 5), (25, 11), (26, 5))


def parse_release(text: str) -> tuple[int, int, int]:
    """`slurm 24.11.5` (or `slurm-wlm 24.11.5`, `24.11.5-1`) -> (24, 11, 5)."""
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if not match:
        raise ValueError(f"no Slurm release in {text.strip()!r}")
    return tuple(int(g) for g in match.groups())


def release_text(release: tuple[int, int, int]) -> str:
    """(24, 5, 3) -> 24.05.3, as Slurm writes its releases."""
    return f"{release[0]}.{release[1]:02d}.{release[2]}"


def family_for(release: tuple[int, int, int], argv: tuple[str, ...] = ("scontrol", "--version")):
    """The format family that reads this release's JSON; a release sigma does not know is an error."""
    from sigma.slurm.formats import data_parser, openapi38

    text = release_text(release)
    if release[:2] not in KNOWN_RELEASES:
        known = ", ".join(f"{a}.{b:02d}" for a, b in KNOWN_RELEASES)
        raise SlurmFormatError(Source(text, "unknown", argv), "version",
                               f"as a release sigma does not know (known: {known})")
    family = openapi38 if release[:2] == (22, 5) else data_parser
    return family.Family(text)


class FamilyBase(ABC):
    """The fields every release names alike are read here; a family says how its states, exit codes and step ids
    are written, and which commands give its records."""

    name = ""
    parsers: tuple[str, ...] = ()  # meta data parser names this family reads
    nodes_argv: tuple[str, ...] = ()
    jobs_argv: tuple[str, ...] = ()
    accounting_argv: tuple[str, ...] = ("sacct", "--json")

    def __init__(self, release: str):
        self.release = release

    def source(self, argv, data: dict) -> Source:
        """Check that the answer's meta names a data parser of this family; return where it came from."""
        parser = self.meta_parser(Record(data, Source(self.release, self.name, tuple(argv)), "$"))
        source = Source(self.release, parser, tuple(argv))
        if parser not in self.parsers:
            raise SlurmFormatError(source, "$.meta.plugin", f"naming data parser {parser or 'none'}, not one that "
                                                            f"sigma reads Slurm {self.release}'s answers with "
                                                            f"({', '.join(self.parsers)})")
        return source

    @staticmethod
    def meta_parser(doc: Record) -> str:
        """meta.plugin.data_parser (23.02+), else meta.plugin.type (22.05: openapi/v0.0.38, sacct's dbv0.0.38)."""
        plugin = doc.record("meta", default={}).record("plugin", default={})
        return plugin.str("data_parser") or plugin.str("type")

    def top(self, data: dict, source: Source, key: str) -> list[Record]:
        return Record(data, source, "$").records(key)

    # ---------- what a family writes its own way ----------
    @abstractmethod
    def node_state(self, r: Record) -> tuple[str, tuple[str, ...]]:
        """(base state in lower case, flags)."""

    @abstractmethod
    def job_state(self, r: Record) -> str:
        """A job record's state, one word in upper case (RUNNING, PENDING, ...)."""

    @abstractmethod
    def run_state(self, state: Record) -> str:
        """An accounting run's state, one word in upper case."""

    @abstractmethod
    def exit_code(self, ec: Record) -> tuple[str, int | None]:
        """(status, signal) of an accounting record's exit_code."""

    @abstractmethod
    def step_id(self, step: Record, job_id: int) -> str:
        """A step's id without its job id: "batch", "0", "extern"."""

    # ---------- the typed results ----------
    def node(self, r: Record) -> Node:
        state, flags = self.node_state(r)
        return Node(
            name=r.str("name", default=...), state=state, flags=flags, reason=r.str("reason"),
            reason_user=r.str("reason_set_by_user"), reason_time=r.int("reason_changed_at"), cpus=r.int("cpus"),
            alloc_cpus=r.int("alloc_cpus"), partitions=r.strs("partitions"), boot_time=r.int("boot_time"),
            slurmd_start_time=r.int("slurmd_start_time"),
        )

    def job(self, r: Record) -> Job:
        return Job(
            job_id=r.int("job_id", default=...), name=r.str("name"), state=self.job_state(r),
            reason=r.str("state_reason"), nodes=tuple(expand_hostlist(r.str("nodes"))),
            restarts=r.int("restart_cnt"), user=r.str("user_name"), user_id=r.int("user_id", default=-1),
            partition=r.str("partition"), submit_time=r.int("submit_time"), start_time=r.int("start_time"),
            end_time=r.int("end_time"), requeue=r.bool("requeue", default=True), batch_host=r.str("batch_host"),
            command=r.str("command"), work_dir=r.str("current_working_directory"), stdout=r.str("standard_output"),
        )

    def run(self, r: Record) -> AccountingRecord:
        t, ec = r.record("time", default={}), r.record("exit_code", default={})
        job_id = r.int("job_id", default=...)
        status, signal = self.exit_code(ec)
        return AccountingRecord(
            job_id=job_id, name=r.str("name"), state=self.run_state(r.record("state", default=...)),
            nodes=tuple(expand_hostlist(r.str("nodes"))), submit_time=t.int("submission"), start_time=t.int("start"),
            end_time=t.int("end"), elapsed_s=t.int("elapsed"), return_code=ec.int("return_code", default=None),
            exit_status=status, signal=signal,
            steps=tuple(self.step_id(s.record("step", default=...), job_id) for s in r.records("steps", default=[])),
        )

    def exit_codes_argv(self, json_argv) -> list[str] | None:
        """A second accounting query whose exit codes correct the JSON's, for releases whose JSON has them wrong."""
        return None

    def runs(self, records: list[Record], exit_codes_text: str | None = None) -> list[AccountingRecord]:
        return [self.run(r) for r in records]
