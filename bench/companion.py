"""The companion's accuracy (execution match) and latency per tier on its evaluation set.

    python bench/companion.py [--verbose]

The set (tests/fixtures/companion/questions.yaml, 45 simple + 45 hard questions with ground-truth SQL) is asked of
the controller database a chaos soak produced (tests/fixtures/companion/soak.sql). The fast tier (no language model)
always runs. The language-model tier runs when SIGMA_LLM_BASE_URL and SIGMA_LLM_MODEL name an OpenAI-compatible
endpoint; without one its row says so (no figure is made up).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sigma.companion.evaluate import evaluate, load_dump, load_questions, summary  # noqa: E402
from sigma.companion.llm import LLMConfig, LLMTier  # noqa: E402
from sigma.companion.safe_sql import open_readonly  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "companion"


def row(name: str, s: dict) -> str:
    by = ", ".join(f"{k} {v}" for k, v in sorted(s["by"].items()))
    return (f"{name:<28} {s['right']:>3}/{s['questions']:<3} {100 * s['accuracy']:>6.1f} %  "
            f"{1000 * s['median_s']:>8.1f} ms  {1000 * s['max_s']:>8.1f} ms   {by}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--verbose", action="store_true", help="print every wrong answer")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "controller.db"
        load_dump(FIXTURES / "soak.sql", db).close()
        conn = open_readonly(db)
        questions = load_questions(FIXTURES / "questions.yaml")
        runs = {"fast tier only": evaluate(conn, questions)}
        cfg = LLMConfig.from_env()
        if cfg:
            runs[f"with LLM {cfg.model}"] = evaluate(conn, questions, llm=LLMTier(cfg))
    print(f"{'run':<28} {'right':>7} {'accuracy':>8}  {'median':>11}  {'max':>11}   answered by")
    for name, scored in runs.items():
        for tier in ("simple", "hard"):
            print(row(f"{name}: {tier}", summary(scored, tier)))
        total_right = sum(s.right for s in scored)
        print(f"{name + ': all':<28} {total_right:>3}/{len(scored):<3} {100 * total_right / len(scored):>6.1f} %")
        if args.verbose:
            for s in scored:
                if not s.right:
                    print(f"   wrong ({s.tier}, {s.answered_by}): {s.question} -- {s.detail}")
    if not cfg:
        print("LLM tier: not measured (set SIGMA_LLM_BASE_URL and SIGMA_LLM_MODEL to an OpenAI-compatible endpoint)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
