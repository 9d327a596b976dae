"""Fault catalogue coverage: every example line of every rule, in every log format its source writes, through the
sidecar's own log sections (configs/telemetry.yaml) and the rules (configs/rules).

    python bench/catalogue.py [--rules configs/rules] [--telemetry configs/telemetry.yaml] [--lines FILE]

Prints lines tried / lines acted on correctly (the expected rule fired with its action, and no other rule drained a
node the expected rule leaves in service), per class (rules file) and per format, then the lines that were not.
--lines FILE adds lines of your own, one `RULE-ID<TAB>LINE` per line (e.g. from your nodes' logs).
Then every *.log under --samples (default: the shared loghub samples, read in place) goes through the kernel
section and the rules as a whole file: the rules each sample sets off, and how many lines they acted on.
--baseline REV runs the same lines side by side through the rules and telemetry config of git revision REV (its
rule ids may differ, so there a line counts when some rule decided the expected action).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from sigma.rules.catalogue import FORMATS_BY_TARGET, cases, sidecar_sections, target_of, try_line
    from sigma.rules.loader import load_rules
    from sigma.rules.schema import DRAIN_ACTIONS
    from sigma.telemetry.logformats import FORMATS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rules", type=Path, default=ROOT / "configs" / "rules")
    p.add_argument("--telemetry", type=Path, default=ROOT / "configs" / "telemetry.yaml")
    p.add_argument("--lines", type=Path, default=None, help="extra RULE-ID<TAB>LINE lines to try in every format")
    p.add_argument("--baseline", default=None, help="git revision whose rules and telemetry config to compare with")
    p.add_argument("--samples", type=Path, default=Path(os.environ.get("SIGMA_DATA") or ROOT.parent / "shared" / "data") / "loghub",
                   help="directory of public log samples (*.log) to run through the kernel section (default: $SIGMA_DATA/loghub, the shared data sets beside the checkout)")
    args = p.parse_args(argv)

    rules = load_rules(args.rules)
    by_id = {r.id: r for r in rules}
    sections = sidecar_sections(args.telemetry)
    file_of = {}
    for path in sorted(args.rules.glob("*.yaml")):
        for r in load_rules(path):
            file_of[r.id] = path.stem
    todo = cases(rules)
    if args.lines:
        for n, raw in enumerate(args.lines.read_text().splitlines(), 1):
            if not raw.strip() or raw.startswith("#"):
                continue
            rule_id, _, line = raw.partition("\t")
            if rule_id not in by_id or not line:
                raise SystemExit(f"{args.lines}:{n}: expected RULE-ID<TAB>LINE with a known rule id, got {raw!r}")
            todo += [(by_id[rule_id], line, fmt) for fmt in FORMATS_BY_TARGET[target_of(by_id[rule_id])]]

    base = _baseline(args.baseline) if args.baseline else None
    t0 = time.perf_counter()
    base_table: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    table: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    rule_rows: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    failures = []
    for rule, line, fmt in todo:
        outcome = try_line(rules, rule, line, fmt, sections)
        cls = file_of.get(rule.id, "?")
        for key in ((cls, fmt), (cls, "all"), ("all", fmt), ("all", "all")):
            table[key][0] += 1
            table[key][1] += outcome.correct
        rule_rows[rule.id][0] += 1
        rule_rows[rule.id][1] += outcome.correct
        if base is not None:
            b = try_line(base[0], rule, line, fmt, base[1])
            ok = any(f.action == rule.action for f in b.findings) and not (
                rule.action not in DRAIN_ACTIONS and any(f.action in DRAIN_ACTIONS for f in b.findings))
            for key in ((cls, fmt), (cls, "all"), ("all", fmt), ("all", "all")):
                base_table[key][0] += 1
                base_table[key][1] += ok
        if not outcome.correct:
            failures.append((rule.id, fmt, outcome))
    elapsed = time.perf_counter() - t0

    classes = sorted({c for c, _ in table if c != "all"}) + ["all"]
    formats = [f for f in FORMATS if any((c, f) in table for c in classes)] + ["all"]
    head = ["class \\ format"] + formats
    def cell(c, f):
        if (c, f) not in table:
            return "-"
        text = f"{table[(c, f)][1]}/{table[(c, f)][0]}"
        return text + (f" ({base_table[(c, f)][1]})" if base is not None else "")

    rows = [head] + [[c] + [cell(c, f) for f in formats] for c in classes]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    print(f"lines acted on correctly / lines tried ({len(todo)} lines, {len(by_id)} rules, "
          f"{elapsed:.1f} s)" + (f"; in parentheses: the same lines with the rules and telemetry config of "
                                 f"{args.baseline}" if base is not None else "") + "\n")
    for i, r in enumerate(rows):
        print("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    tried = [r for r in by_id.values() if r.log is not None]
    without = sorted(r.id for r in tried if r.id not in rule_rows and "*" not in r.log.kinds)
    print(f"log rules with example lines: {len(rule_rows)} of {len(tried)}"
          + (f"; without: {', '.join(without)}" if without else ""))
    for rule_id, fmt, o in failures:
        fired = ", ".join(f"{f.rule_id}={f.action}" for f in o.findings) or "nothing"
        kinds = ", ".join(e["kind"] for e in o.events) or "no event"
        print(f"NOT ACTED ON  {rule_id} [{fmt}] {o.line[:120]!r}: event {kinds}; fired {fired}")
    if args.samples.is_dir():
        from sigma.rules.catalogue import act_on_file

        print(f"\npublic samples ({args.samples}): lines / events / what the rules decide (lines acted on)")
        for path in sorted(args.samples.rglob("*.log")):
            events, findings = act_on_file(rules, sections, path)
            decided = ", ".join(f"{f.rule_id}={f.action} ({f.evidence.get('count', 1)})" for f in findings) or "nothing"
            n = sum(1 for _ in path.open("rb"))
            print(f"  {path.relative_to(args.samples)}: {n} lines / {len(events)} events / {decided}")
    return 0 if not failures else 1


def _baseline(rev: str):
    """(rules, logtail sections) of another git revision, read from a temporary copy."""
    from sigma.rules.catalogue import sidecar_sections
    from sigma.rules.loader import load_rules

    tmp = Path(tempfile.mkdtemp(prefix="sigma-catalogue-"))
    files = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", rev, "configs/rules",
                            "configs/telemetry.yaml"], capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        dest = tmp / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{name}"], capture_output=True,
                                        check=True).stdout)
    return load_rules(tmp / "configs" / "rules"), sidecar_sections(tmp / "configs" / "telemetry.yaml")


if __name__ == "__main__":
    sys.exit(main())
