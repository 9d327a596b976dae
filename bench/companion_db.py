"""Regenerate the companion's evaluation database (tests/fixtures/companion/soak.sql) from a real chaos soak.

    python bench/companion_db.py                      # runs a full soak on a local cluster, then exports
    python bench/companion_db.py --from STATE/controller.db

The soak (bench/chaos_soak.py) runs to completion: every fault kind and every catalogue signature once, with
just-in-time checkpoints as shipped, and with a few rules in shadow mode (--shadow; decided and journalled, never
acted on, as a site runs a rule that is still proving itself), so that the data holds steps lost, checkpoint
requests and shadow-mode incidents as a site's controller would. That takes over an hour on a loaded machine.

The export keeps every table the companion reads (sigma/companion/safe_sql.py) whole — incidents, actions, node
lifecycle, node snapshots, events, KPIs, checkpoint requests, job losses — less the KPI lines' free-form payload
(the companion reads none of it), and thins the telemetry samples to a few host metrics once a minute per node, so
the fixture stays small and readable: a SQL text dump, numbers written as Python writes them (exact, and shorter
than SQLite's own dump), loaded into a fresh database by the tests and benches.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "companion" / "soak.sql"
KEEP_METRICS = ("host.cpu.util_pct", "host.load1", "host.mem.available_bytes")
SAMPLE_EVERY_S = 60
TABLES = ("incidents", "actions", "node_lifecycle", "lifecycle_transitions", "node_snapshots", "events", "kpis",
          "checkpoint_requests", "job_losses")
# A drain rule and a job-restart rule: what "which rules are in shadow mode, and what would they have done" asks.
SHADOW = ("ib-port-flapping", "nccl-watchdog-timeout")


def sql_value(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    if isinstance(v, bytes):
        return "X'" + v.hex() + "'"
    return repr(v)   # int, or the shortest text that reads back as the same float


def export(src: Path, out: Path) -> None:
    conn = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    marks = ",".join("?" * len(KEEP_METRICS))
    reads = [(t, f"SELECT * FROM {t} ORDER BY rowid", ()) for t in TABLES if t != "kpis"]
    kpis = ", ".join("'{}' AS payload" if r[1] == "payload" else r[1] for r in conn.execute("PRAGMA table_info(kpis)"))
    reads.append(("kpis", f"SELECT {kpis} FROM kpis ORDER BY rowid", ()))
    reads.append(("samples", f"SELECT * FROM samples WHERE metric IN ({marks}) AND CAST(ts AS INTEGER) % "
                             f"{SAMPLE_EVERY_S} = 0 ORDER BY rowid", KEEP_METRICS))
    lines = [f'INSERT INTO "{t}" VALUES({",".join(map(sql_value, row))});'
             for t, sql, args in reads for row in conn.execute(sql, args)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("-- The companion's evaluation data: a chaos soak's controller database (bench/companion_db.py).\n"
                   + "\n".join(lines) + "\n")
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB, {len(lines)} rows)")


def soak(state: Path, shadow: list[str], soak_args: list[str]) -> int:
    """bench/chaos_soak.py with `shadow` rules in shadow mode. Its exit code: a shadowed rule's fault is, rightly,
    never acted on, so the soak counts it as not handled (and waits its fault timeout for it)."""
    sys.path.insert(0, str(REPO / "bench"))
    import chaos_soak

    class ShadowSoak(chaos_soak.Soak):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if shadow:
                self.up_args += ["--set", f"shadow_rules=[{','.join(shadow)}]"]

    chaos_soak.Soak = ShadowSoak
    return chaos_soak.main(["--state-dir", str(state), *soak_args])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="src", type=Path, help="a controller.db to export (default: run a soak)")
    p.add_argument("--shadow", nargs="*", default=list(SHADOW), help="rules the soak's controller runs in shadow mode")
    p.add_argument("--state-dir", type=Path, default=None, help="the soak's cluster state (default: a new one)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("soak_args", nargs="*", help="after --: more bench/chaos_soak.py options (e.g. --seed 1)")
    args = p.parse_args()
    src = args.src
    if src is None:
        state = args.state_dir or Path(tempfile.mkdtemp(prefix="sigma-companion-soak-"))
        rc = soak(state, args.shadow, ["--minutes", "0", *args.soak_args])
        print(f"soak exit code {rc} (faults of rules in shadow mode are never acted on: expected not handled)")
        src = state / "controller.db"
    export(src, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
