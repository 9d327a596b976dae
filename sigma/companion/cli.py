"""`sigma ask QUESTION`: a plain-language question answered from the controller database (read-only)."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ask", help="answer a question about the cluster from the controller's data",
                       description="Answer a plain-language question (nodes, jobs, incidents, drains, recovery "
                                   "times) from the controller database with read-only SQL. Simple questions are "
                                   "answered from a catalogue; hard ones by a language model when "
                                   "SIGMA_LLM_BASE_URL and SIGMA_LLM_MODEL name an OpenAI-compatible endpoint.")
    p.add_argument("question", nargs="+", help="the question, in plain words")
    p.add_argument("--config", default=None, help="controller config (default $SIGMA_CONTROLLER_CONFIG or "
                                                   "configs/controller.yaml)")
    p.add_argument("--db", default=None, help="controller database (overrides the config's db)")
    p.add_argument("--show-sql", action="store_true",
                   help="print how the question was read and the query that produced the answer")
    p.add_argument("--tz", default=None, help="the site's timezone for times in questions and answers, e.g. "
                                              "Europe/Berlin (default $SIGMA_TIMEZONE, else this machine's)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-llm", action="store_true", help="catalogue only, even when a language model is configured")
    p.add_argument("--url", help="ask a controller over HTTP (POST URL/v1/ask) instead of reading its database")
    p.add_argument("--key-file", default="/etc/sigma/keys/companion.key",
                   help="with --url: the key to sign with (`sigma keys issue companion`)")
    p.set_defaults(func=_ask)


def _ask(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from sigma.companion.ask import ask
    from sigma.companion.llm import LLMConfig, LLMTier
    from sigma.companion.safe_sql import open_readonly
    from sigma.companion.say import site_tz, value
    from sigma.controller.cli import _config

    question = " ".join(args.question)
    if args.url:
        from dataclasses import fields

        from sigma.companion.answer import Answer
        from sigma.companion.http import ask_remote

        reply = ask_remote(args.url, args.key_file, question, llm=not args.no_llm)
        answer = Answer(**{f.name: reply[f.name] for f in fields(Answer) if f.name in reply})
    else:
        conn = open_readonly(_config(args).db)
        cfg = None if args.no_llm else LLMConfig.from_env()
        answer = ask(conn, question, llm=LLMTier(cfg) if cfg else None, tz=site_tz(args.tz))
    if args.json:
        print(json.dumps(answer.to_json(), indent=2, default=str))
        return 0
    console = Console()
    if not console.is_terminal:  # piped to a file or less: do not cut the table to 80 columns
        console = Console(width=200)
    console.print(answer.text, soft_wrap=True)
    if answer.rows:
        table = Table()
        for col in answer.columns:
            table.add_column(col)
        tz = site_tz(args.tz)
        for row in answer.rows[:50]:
            table.add_row(*("" if v is None else value(v, answer.units.get(c, ""), tz)
                            for c, v in zip(answer.columns, row)))
        console.print(table)
        if len(answer.rows) > 50 or answer.truncated:
            console.print(f"(first 50 of {len(answer.rows)}{'+' if answer.truncated else ''} rows; --json for all)")
    if args.show_sql:
        if answer.understood:
            console.print(f"[dim]read as: {answer.understood} ({answer.status})[/dim]", soft_wrap=True)
        if answer.sql:
            console.print(f"[dim]{answer.tier} tier: {answer.sql}  params={answer.params}[/dim]", soft_wrap=True)
    return 0
