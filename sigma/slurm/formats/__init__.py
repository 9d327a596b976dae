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

from sigma.slurm.formats.fields import Record, SlurmFormatError, Source
from sigma.slurm.types import AccountingRecord

# Slurm's releases from the first with --json on every command sigma runs to the newest checked
KNOWN_RELEASES = ((22, 5), (23, 2), (23, 11), (24, 5), (24, 11), (25, 5), (25, 11), (26, 5))
TESTED_RELEASES = ((22, 5), (24, 11), (26, 5))  # run against real daemons in CI (docs/slurm-versions.md)


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


class FamilyBase:
    """What every family offers; the commands and the reading differ."""

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

    def exit_codes_argv(self, json_argv) -> list[str] | None:
        """A second accounting query whose exit codes correct the JSON's, for releases whose JSON has them wrong."""
        return None

    def runs(self, records: list[Record], exit_codes_text: str | None = None) -> list[AccountingRecord]:
        return [self.run(r) for r in records]
