"""Candidates on disk, next to the knowledge base: `<rules dir>/candidates/<id>.yaml`, and promotion into
`<rules dir>/learned.yaml`.

Files, not a database table: the knowledge base is YAML an admin reviews, diffs and keeps in version control, and
a candidate is read the same way before it joins it (the loader reads only `*.yaml` at the top of the rules
directory, so candidates never run). Every write goes to a temporary file in the same directory and is renamed
over the target (atomic on POSIX): a crash or a refused candidate leaves the previous files as they were, and a
promotion is checked by loading the whole knowledge base with the new file before it replaces the old one.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import yaml

from sigma.config import ConfigError
from sigma.rules.learn import LearnError
from sigma.rules.learn.review import RepairError, repair
from sigma.rules.loader import load_rule_file, load_rules

LEARNED_FILE = "learned.yaml"
LEARNED_HEADER = ("# Rules learned from confirmed incidents (sigma rules learn), promoted with sigma rules promote.\n"
                  "# Each starts in shadow mode; `sigma rules promote ID --live` makes it act.\n")


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Candidates:
    def __init__(self, rules_location: str | Path, candidates_dir: str | Path | None = None):
        self.kb = Path(rules_location)
        self.dir = Path(candidates_dir) if candidates_dir else (
            self.kb if self.kb.is_dir() else self.kb.parent) / "candidates"

    # ---------- candidates ----------
    def write(self, record: dict) -> Path:
        path = self.dir / f"{record['candidate']['id']}.yaml"
        atomic_write(path, yaml.safe_dump(record, sort_keys=False, width=120))
        return path

    def all(self) -> list[dict]:
        if not self.dir.is_dir():
            return []
        return [self._read(p) for p in sorted(self.dir.glob("*.yaml"))]

    def get(self, cid: str) -> dict:
        exact = self.dir / f"{cid}.yaml"
        if exact.exists():
            return self._read(exact)
        found = [p for p in sorted(self.dir.glob(f"{cid}*.yaml"))] if self.dir.is_dir() else []
        if len(found) != 1:
            raise LearnError(f"no candidate {cid!r} in {self.dir}" if not found else
                             f"{cid!r} is ambiguous: {', '.join(p.stem for p in found)}")
        return self._read(found[0])

    def _read(self, path: Path) -> dict:
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise LearnError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(data, dict) or "candidate" not in data or "rule" not in data:
            raise LearnError(f"{path}: not a candidate file (needs 'candidate' and 'rule')")
        return data

    def set_status(self, cid: str, status: str, **extra) -> dict:
        record = self.get(cid)
        record["candidate"].update(status=status, status_at=time.strftime("%Y-%m-%d %H:%M:%S"), **extra)
        self.write(record)
        return record

    # ---------- the knowledge base ----------
    def promote(self, cid: str, live: bool = False) -> dict:
        """Put the candidate's rule into learned.yaml (shadow unless live); promoting a promoted one again with
        live=True takes it out of shadow."""
        if not self.kb.is_dir():
            raise LearnError(f"promotion needs the knowledge base to be a directory of rule files, not {self.kb}")
        record = self.get(cid)
        status = record["candidate"].get("status")
        if status == "rejected":
            raise LearnError(f"candidate {record['candidate']['id']} was rejected; learn again to get a new one")
        raw = dict(record["rule"])
        raw["shadow"] = not live
        try:
            repair(raw)  # the file may have been edited by hand since it was learned
        except RepairError as exc:
            raise LearnError(f"candidate {record['candidate']['id']}: {exc}") from None
        learned = self.kb / LEARNED_FILE
        current = (yaml.safe_load(learned.read_text()) or {}) if learned.exists() else {}
        rules = [r for r in current.get("rules", []) if r.get("id") != raw["id"]] + [raw]
        text = LEARNED_HEADER + yaml.safe_dump({"version": 1, "rules": rules}, sort_keys=False, width=120)
        self._check_kb_with(learned, text)
        atomic_write(learned, text)
        return self.set_status(record["candidate"]["id"], "live" if live else "shadow",
                               promoted_to=str(learned))

    def _check_kb_with(self, learned: Path, text: str) -> None:
        """Load every rule file of the knowledge base as it will be, before anything is replaced."""
        with tempfile.TemporaryDirectory(dir=self.kb, prefix=".promote.") as tmp:
            for f in self.kb.glob("*.yaml"):
                if f.name != learned.name:
                    (Path(tmp) / f.name).write_text(f.read_text())
            (Path(tmp) / learned.name).write_text(text)
            try:
                load_rules(tmp)
            except ConfigError as exc:
                raise LearnError(f"the knowledge base would not load with this rule: "
                                 f"{str(exc).replace(tmp, str(self.kb))}") from None

    def learned_rules(self) -> list:
        learned = self.kb / LEARNED_FILE if self.kb.is_dir() else None
        return load_rule_file(learned) if learned and learned.exists() else []
