"""Fault catalogue coverage on real log lines: tests/fixtures/catalogue/corpus.yaml (lines from public bug reports,
vendor documents and driver sources, each with the action a careful admin wants) through the sidecar's own log
sections (configs/telemetry.yaml) and the rules (configs/rules), as a node would read them.

    python bench/catalogue.py [--baseline REV] [--corpus FILE] [--show-heldout] [--examples] [--samples DIR]

Every line is written as published (its own envelope: dmesg, syslog, journalctl in any locale, appliance formats,
job output); a line quoted without its envelope is wrapped the way Debian's rsyslog writes kern.log. Lines are
judged as if read now. Figures, for each part of the corpus apart (see the corpus README): the tuning part, the
held-out part (held out by source, fixed before any pattern was written), the second held-out part (sources
gathered after the first patterns, marked `part: held-out-2`), the third (sources gathered after both were tuned
on, marked `part: held-out-3`), the fourth (gathered after the third's misses were fixed, `part: held-out-4`), the
fifth (gathered after the services section and the fourth's fixes, `part: held-out-5`), the sixth (gathered after
the fifth's fixes, `part: held-out-6`), the seventh (gathered after the sixth's fixes, `part: held-out-7`), the
eighth (gathered after the seventh's fixes, `part: held-out-8`), the ninth (sampled by fixed generic searches after
the eighth's fixes, not aimed at gaps, `part: held-out-9`), the tenth (sampled by the same protocol with new
queries after the ninth's fixes, `part: held-out-10`), the eleventh (every log line quoted by public logbooks of
large training runs, in order, after the tenth's fixes, `part: held-out-11`), the twelfth (the same protocol over
logbooks the eleventh did not reach, after its fixes, `part: held-out-12`), the thirteenth (sampled by fixed
queries naming the venues where GPU-cluster admins ask for help, after the twelfth's fixes, `part: held-out-13`) and
the fourteenth (sampled by fixed queries naming the software that runs on training clusters, after the thirteenth's
fixes, `part: held-out-14`):
  node-action lines acted on     lines that call for drain / drain+reboot / drain+ticket that got a node action
  exact                          ... that got the very action the line calls for
  job-level lines acted on       lines that call for a job restart that got one (and no node action)
  benign lines with node action  lines that call for notify / record / nothing that took a node out (must be 0)
  no event, action needed        lines that call for an action that made no event at all (must be 0)
  unattributed                   lines whose source could not be established (not acted on as the kernel's)
--baseline REV runs the same lines through the code, rules and telemetry config of git revision REV (default: the
previous release, 79a1320) in a subprocess, side by side. Failures are listed for the tuning part only, unless
--show-heldout. --examples adds every rule's example lines in every envelope; --samples runs whole public log files
(the shared loghub samples) through the kernel section.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "catalogue" / "corpus.yaml"
DRAIN = ("drain", "drain+reboot", "drain+ticket")
JOB_ID = 4242
PREVIOUS_RELEASE = "79a1320"


def files_only(params) -> dict:
    """The settings that make a logtail section read its files only, in the code of this revision or of the
    baseline's (which named its kernel-log sources `kmsg` and `journal` flags before `source`)."""
    names = {f.name for f in dataclasses.fields(params)}
    return {k: v for k, v in {"source": "files", "kmsg": False, "journal": False}.items() if k in names}


def heldout(src: str) -> bool:
    """The held-out part of the corpus, by source (fixed before any pattern was written)."""
    return hashlib.sha256(src.encode()).digest()[0] % 10 < 3


PARTS = ("tuning", "held-out", "held-out-2", "held-out-3", "held-out-4", "held-out-5", "held-out-6",
         "held-out-7", "held-out-8", "held-out-9", "held-out-10", "held-out-11",
         "held-out-12", "held-out-13", "held-out-14")


def load_corpus(path: Path) -> list[dict]:
    """Every line of the corpus; a source names its part, or falls in the first split by the hash of its address."""
    import yaml

    rows = []
    for source in yaml.safe_load(path.read_text())["sources"]:
        part = source.get("part") or ("held-out" if heldout(source["src"]) else "tuning")
        if part not in PARTS:
            raise ValueError(f"{path}: source {source['src']}: unknown part {part!r} (one of {', '.join(PARTS)})")
        for want, cls, fmt, line in source["lines"]:
            rows.append({"src": source["src"], "want": want, "cls": cls, "fmt": fmt, "line": line, "part": part})
    return rows


def evaluate(rows: list[dict], rules_dir: Path, telemetry: Path) -> list[dict]:
    """What the sidecar and the rules of the sigma package on sys.path make of each row (only APIs that exist in the
    previous release, so the same function measures the baseline in a subprocess)."""
    from dataclasses import replace

    from sigma.rules.catalogue import sidecar_sections
    from sigma.rules.loader import load_rules
    from sigma.rules.matcher import evaluate as evaluate_rules
    from sigma.telemetry.base import Context, Output
    from sigma.telemetry.collectors.logtail import LogTailCollector

    rules = load_rules(rules_dir)
    sections = sidecar_sections(telemetry)
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000+00:00", time.gmtime(now))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "proc").mkdir()
        (root / "proc" / "stat").write_text(f"cpu 0 0 0 0\nbtime {int(now - 86400)}\n")
        for i, row in enumerate(rows):
            job = row["fmt"] == "job" or row["cls"].startswith("job-")  # where a node reads it: its envelope (a
            # SLURM client's line about the node's prolog or memory is in the job's output, whatever its fault domain)
            text = row["line"]
            if row["fmt"] == "message" and not job:
                text = f"{stamp} node1 kernel: {text}"  # as Debian 12's rsyslog writes kern.log
            path = root / f"job-{JOB_ID}" / f"out{i}.node1.log" if job else root / f"kern{i}.log"
            path.parent.mkdir(exist_ok=True)
            path.write_text(text + "\n")
            # a node's kernel log and its services' log are the same syslog file where rsyslog writes one: each
            # section takes the lines it can attribute (a release without a services section reads the kernel's)
            names = ["job_output"] if job else [n for n in ("kernel", "services") if n in sections]
            events = []
            for name in names:
                params = replace(sections[name], files=[str(path)], start_at="start", **files_only(sections[name]))
                collector = LogTailCollector(name, params, Context(node="node1", node_dir=tmp, host_root=tmp))
                out = Output(ts=now)
                try:
                    collector.collect(out)
                finally:
                    collector.close()
                events += [{"id": len(events) + n, "node": "node1", "ts": now, "source": e[1], "kind": e[2],
                            "severity": e[3], "message": e[4], "fields": json.loads(e[5]),
                            "job_ids": json.loads(e[6]) if e[6] else [JOB_ID]} for n, e in enumerate(out.events)]
            lines = [e for e in events if e["source"] in ("log", "service")]
            unattributed = [e for e in events if e["kind"] == "log_unattributed"]
            findings = evaluate_rules(rules, now=now + 1, events=lines, jobs_on_node={"node1": [JOB_ID]})
            results.append({"events": [e["kind"] for e in lines],
                            "unattributed": bool(unattributed) and not lines,  # no section took it
                            "actions": sorted({f.action for f in findings}),
                            "rules": sorted({f"{f.rule_id}={f.action}" for f in findings})})
    return results


def score(row: dict, res: dict) -> dict:
    """Which figures a row counts in, and whether it passed each."""
    want, acts = row["want"], set(res["actions"])
    node, job = bool(acts & set(DRAIN)), "requeue" in acts
    out = {}
    if want in DRAIN:
        out["node"] = node
        out["exact"] = want in acts
    elif want == "requeue":
        out["job"] = job and not node
    else:
        out["benign_node"] = node  # a failure when True
        out["benign_job"] = job  # a healthy job restarted: a failure when True
    if want in DRAIN + ("requeue", "notify"):
        out["no_event"] = not res["events"]  # a failure when True
    if want == "notify":
        out["notify"] = "notify" in acts and not node
    return out


FIGURES = [("node", "node-action lines acted on", False), ("exact", "  ... with the exact action", False),
           ("job", "job-level lines acted on", False), ("notify", "notify lines notified", False),
           ("benign_node", "benign lines with a node action", True),
           ("benign_job", "benign lines with a job restart", True), ("no_event", "no event, action needed", True)]
FAILED_WHEN_TRUE = {fig for fig, _, bad in FIGURES if bad}


def tally(rows, results, key=None) -> dict:
    table: dict = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for row, res in zip(rows, results):
        for fig, passed in score(row, res).items():
            cell = table[key(row) if key else "all"][fig]
            cell[0] += passed
            cell[1] += 1
    return table


def cell(t, fig) -> str:
    if fig not in t:
        return "-"
    hit, n = t[fig]
    return f"{hit}/{n}"


def print_part(name, rows, results, base):
    print(f"\n== {name} part: {len(rows)} lines from {len({r['src'] for r in rows})} sources ==")
    mine, theirs = tally(rows, results)["all"], tally(rows, base)["all"] if base else None
    width = max(len(label) for _, label, _ in FIGURES)
    print(f"  {'':{width}}  {'this':>9}  {'baseline' if base else '':>9}")
    for fig, label, bad in FIGURES:
        pct = ""
        if fig in mine and not bad and mine[fig][1]:
            pct = f" ({100 * mine[fig][0] / mine[fig][1]:.1f} %)"
        print(f"  {label:{width}}  {cell(mine, fig):>9}  {cell(theirs, fig) if base else '':>9}{pct}")
    unattributed = sum(r["unattributed"] for r in results)
    print(f"  {'unattributed lines (not acted on)':{width}}  {unattributed:>9}")
    for key, title in (("cls", "class"), ("fmt", "format")):
        mine_k = tally(rows, results, key=lambda r: r[key])
        base_k = tally(rows, base, key=lambda r: r[key]) if base else {}
        print(f"\n  by {title}: node-action acted, job-level acted, benign with node action, no event"
              + (" (baseline in parentheses)" if base else ""))
        for k in sorted(mine_k):
            parts = []
            for fig in ("node", "job", "benign_node", "no_event"):
                text = cell(mine_k[k], fig)
                if base:
                    text += f" ({cell(base_k.get(k, {}), fig)})"
                parts.append(f"{text:>15}")
            print(f"    {k:20} " + " ".join(parts))


def failures(rows, results, show_heldout: bool) -> list[str]:
    out = []
    for row, res in zip(rows, results):
        if row["part"] != "tuning" and not show_heldout:
            continue
        s = score(row, res)
        bad = [f for f, v in s.items() if (v if f in FAILED_WHEN_TRUE else not v)]
        if bad:
            out.append(f"  [{row['part']}] want {row['want']:12} got {','.join(res['rules']) or 'nothing':40} "
                       f"events {','.join(res['events']) or '-':20} {row['fmt']:16} {row['line'][:110]!r}")
    return out


def baseline(rev: str, corpus: Path) -> list[dict]:
    """Evaluate the corpus with the code and configs of git revision `rev`, in a subprocess on a copy of it."""
    tmp = Path(tempfile.mkdtemp(prefix="sigma-catalogue-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "sigma", "configs"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    proc = subprocess.run([sys.executable, __file__, "--evaluate-in", str(tmp), "--corpus", str(corpus)],
                          capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(tmp)})
    return json.loads(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=CORPUS)
    p.add_argument("--rules", type=Path, default=None, help="rules directory (default: configs/rules)")
    p.add_argument("--telemetry", type=Path, default=None, help="telemetry config (default: configs/telemetry.yaml)")
    p.add_argument("--baseline", default=PREVIOUS_RELEASE, help="git revision to compare with ('' for none)")
    p.add_argument("--show-heldout", action="store_true", help="also list the held-out parts' lines that were missed")
    p.add_argument("--examples", action="store_true", help="also every rule's example lines in every envelope")
    p.add_argument("--samples", type=Path, default=None, help="directory of public log samples (*.log) to run too")
    p.add_argument("--evaluate-in", type=Path, default=None, help=argparse.SUPPRESS)  # baseline subprocess
    args = p.parse_args(argv)

    rows = load_corpus(args.corpus)
    if args.evaluate_in:
        tree = args.evaluate_in
        print(json.dumps(evaluate(rows, tree / "configs" / "rules", tree / "configs" / "telemetry.yaml")))
        return 0
    sys.path.insert(0, str(ROOT))
    from sigma.paths import configs_dir

    rules_dir = args.rules or configs_dir() / "rules"
    telemetry = args.telemetry or configs_dir() / "telemetry.yaml"
    t0 = time.perf_counter()
    results = evaluate(rows, rules_dir, telemetry)
    elapsed = time.perf_counter() - t0
    base = baseline(args.baseline, args.corpus) if args.baseline else None
    print(f"{len(rows)} real log lines from {len({r['src'] for r in rows})} public sources through {telemetry} and "
          f"{rules_dir} ({elapsed:.1f} s)" + (f"; baseline: revision {args.baseline}" if base else ""))
    for part in PARTS:
        idx = [i for i, r in enumerate(rows) if r["part"] == part]
        print_part(part, [rows[i] for i in idx], [results[i] for i in idx], [base[i] for i in idx] if base else None)
    missed = failures(rows, results, args.show_heldout)
    print(f"\nlines not handled as wanted ({len(missed)}"
          + ("" if args.show_heldout else ", held-out parts not listed") + "):")
    print("\n".join(missed) if missed else "  none")
    if args.examples:
        examples(rules_dir, telemetry)
    if args.samples:
        samples(rules_dir, telemetry, args.samples)
    return 0


def examples(rules_dir: Path, telemetry: Path) -> None:
    """Every example line of every rule, in every envelope its source writes."""
    from sigma.rules.catalogue import cases, sidecar_sections, try_line
    from sigma.rules.loader import load_rules

    rules = load_rules(rules_dir)
    sections = sidecar_sections(telemetry)
    per_format: dict = defaultdict(lambda: [0, 0])
    bad = []
    for rule, line, fmt in cases(rules):
        outcome = try_line(rules, rule, line, fmt, sections)
        per_format[fmt][0] += outcome.correct
        per_format[fmt][1] += 1
        if not outcome.correct:
            bad.append(f"  {rule.id} [{fmt}] {outcome.line[:100]!r}")
    print("\nrule examples in every envelope: " + ", ".join(f"{f} {a}/{n}" for f, (a, n) in per_format.items()))
    print("\n".join(bad))


def samples(rules_dir: Path, telemetry: Path, directory: Path) -> None:
    """Whole public log files through the kernel section: what the rules decide on each."""
    from sigma.rules.catalogue import act_on_file, sidecar_sections
    from sigma.rules.loader import load_rules

    rules = load_rules(rules_dir)
    sections = sidecar_sections(telemetry)
    print(f"\npublic samples ({directory}): lines / events / what the rules decide (lines acted on)")
    for path in sorted(directory.rglob("*.log")):
        events, findings = act_on_file(rules, sections, path)
        decided = ", ".join(f"{f.rule_id}={f.action} ({f.evidence.get('count', 1)})" for f in findings) or "nothing"
        n = sum(1 for _ in path.open("rb"))
        print(f"  {path.relative_to(directory)}: {n} lines / {len(events)} events / {decided}")


if __name__ == "__main__":
    sys.exit(main())
