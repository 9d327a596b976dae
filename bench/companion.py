"""The companion's accuracy (execution match), answers given as fact that are wrong, and latency, per question set.

    python bench/companion.py [--verbose]

Sets (tests/fixtures/companion/questions/): built.yaml, the questions the fast tier was written against;
held_out.yaml, paraphrases and new questions written before the tier and kept apart (run once against it, then the
faults it showed were fixed: its figure is no longer unseen); held_out_2.yaml, written after that run and before those
fixes, never used to change the tier; held_out_3.yaml, written before negation; held_out_4.yaml, written before the
full-soak database and before the tier asked back on words with several readings; held_out_5.yaml, written after the
tier's changes on the full-soak database; held_out_6.yaml, written after those; held_out_7.yaml, written before the
stated defaults for one value of several rows; held_out_8.yaml, written from the schema alone and run once (its
wrong facts and misses then looked at: no longer unseen); held_out_9.yaml, written after the changes that followed and
committed before it was run; held_out_10.yaml, written after the changes that followed, from the schema alone by a
writer who did not read the tier, committed before it was run, measured once, then its misses looked at (no longer
unseen); held_out_11.yaml, written after those changes the same way, committed before it was run; held_out_12.yaml,
written after the changes for held_out_11 the same way, committed before it was run; held_out_13.yaml,
written after the changes for held_out_12 the same way, committed before it was run; held_out_14.yaml likewise after
held_out_13's run (docs/companion.md says which run
of each set was unseen). Each is asked of the controller database a chaos
soak produced (tests/fixtures/companion/soak.sql) with the site's timezone the sets name. The fast tier (no language
model) always runs; the language-model tier runs when SIGMA_LLM_BASE_URL and SIGMA_LLM_MODEL name an
OpenAI-compatible endpoint, and otherwise its row says so (no figure is made up). Latency is per question, after the
first question of the run has learnt the database's vocabulary (timed on its own line).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sigma.companion import fast  # noqa: E402
from sigma.companion.evaluate import evaluate, load_dump, load_questions, summary  # noqa: E402
from sigma.companion.llm import LLMConfig, LLMTier  # noqa: E402
from sigma.companion.safe_sql import open_readonly  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "companion"
SETS = ("built", "held_out", "held_out_2", "held_out_3", "held_out_4", "held_out_5", "held_out_6", "held_out_7",
        "held_out_8", "held_out_9", "held_out_10", "held_out_11", "held_out_12", "held_out_13",
        "held_out_14", "held_out_15", "held_out_16", "held_out_17", "held_out_18", "held_out_19")


def row(name: str, s: dict) -> str:
    by = ", ".join(f"{k} {v}" for k, v in sorted(s["by"].items()))
    return (f"{name:<34} {s['right']:>3}/{s['questions']:<3} {100 * s['accuracy']:>6.1f} %  {s['wrong_facts']:>5}  "
            f"{1000 * s['median_s']:>8.1f} ms  {1000 * s['max_s']:>8.1f} ms   {by}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--verbose", action="store_true", help="print every answer that is not right")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "controller.db"
        load_dump(FIXTURES / "soak.sql", db).close()
        conn = open_readonly(db)
        started = time.monotonic()
        fast.parser_for(conn)
        learn_s = time.monotonic() - started
        cfg = LLMConfig.from_env()
        tiers = {"fast": None} | ({f"LLM {cfg.model}": LLMTier(cfg)} if cfg else {})
        print(f"vocabulary learnt from the database in {1000 * learn_s:.0f} ms (once per database and schema version, again after a minute)")
        print(f"{'set / tier':<34} {'right':>7} {'accuracy':>8}  {'wrong':>5}  {'median':>11}  {'max':>11}   "
              "answers (status)")
        for tier, llm in tiers.items():
            for name in SETS:
                path = FIXTURES / "questions" / f"{name}.yaml"
                tz = ZoneInfo(yaml.safe_load(path.read_text()).get("timezone", "UTC"))
                scored = evaluate(conn, load_questions(path), llm=llm, tz=tz)
                for part in ("simple", "hard"):
                    print(row(f"{tier}: {name}: {part}", summary(scored, part)))
                if args.verbose:
                    for s in scored:
                        if not s.right:
                            print(f"   {'WRONG' if s.wrong_fact else 'miss'} ({s.tier}, {s.status}): {s.question} "
                                  f"-- {s.detail[:140]}")
    if not cfg:
        print("LLM tier: not measured (set SIGMA_LLM_BASE_URL and SIGMA_LLM_MODEL to an OpenAI-compatible endpoint)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
