"""Regenerate the companion's evaluation database (tests/fixtures/companion/soak.sql) from a real chaos soak.

    python bench/companion_db.py                      # runs a short soak on a local cluster, then exports
    python bench/companion_db.py --from STATE/controller.db

The export keeps every decision table whole (incidents, actions, node lifecycle, node snapshots, events, KPIs) and
thins the telemetry samples to a few host metrics every 10 s per node, so the fixture stays small and readable
(a SQL text dump, loaded into a fresh database by the tests and benches).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "companion" / "soak.sql"
KEEP_METRICS = ("host.cpu.util_pct", "host.load1", "host.mem.available_bytes")
TABLES = ("incidents", "actions", "node_lifecycle", "lifecycle_transitions", "node_snapshots", "events", "kpis")


def export(src: Path, out: Path) -> None:
    from sigma.controller.db import open_db

    with tempfile.TemporaryDirectory() as tmp:
        dst = open_db(Path(tmp) / "eval.db")
        dst.execute("ATTACH DATABASE ? AS src", (f"file:{src}?mode=ro",))
        with dst:
            for t in TABLES:
                dst.execute(f"INSERT INTO main.{t} SELECT * FROM src.{t}")
            marks = ",".join("?" * len(KEEP_METRICS))
            dst.execute(f"INSERT INTO main.samples SELECT * FROM src.samples WHERE metric IN ({marks}) "
                        "AND CAST(ts AS INTEGER) % 10 = 0", KEEP_METRICS)
        dst.execute("DETACH DATABASE src")
        lines = [line for line in dst.iterdump()
                 if line.startswith("INSERT INTO") and not line.startswith('INSERT INTO "migrations"')]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("-- The companion's evaluation data: a chaos soak's controller database (bench/companion_db.py).\n"
                   + "\n".join(lines) + "\n")
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB, {len(lines)} rows)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="src", type=Path, help="a controller.db to export (default: run a soak)")
    p.add_argument("--minutes", type=float, default=8.0, help="soak length when running one")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    src = args.src
    if src is None:
        state = Path(tempfile.mkdtemp(prefix="sigma-companion-soak-"))
        # two catalogue signatures a round: every signature would make it a run of over an hour
        subprocess.run([sys.executable, str(REPO / "bench" / "chaos_soak.py"), "--minutes", str(args.minutes),
                        "--signatures", "2", "--state-dir", str(state)], check=True)
        src = state / "controller.db"
    export(src, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
