"""`sigma numerics record|check|faults`: cross-platform numerical validation of the training components.

    sigma numerics record --config configs/train/tiny.yaml --out REF [--steps 10] [--data random,real] [key=value ...]
    sigma numerics check --reference REF [--device cpu|cuda] [--dtype float32|bfloat16] [--fault NAME] [--json]
    sigma numerics faults
"""

from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser("numerics", help="validate training numerics on a platform against a reference")
    sub = parser.add_subparsers(dest="numerics_command", metavar="SUBCOMMAND", required=True)

    rec = sub.add_parser("record", help="record a reference run on a trusted platform (docs/stability.md)")
    rec.add_argument("--config", required=True, help="run preset, e.g. configs/train/tiny.yaml")
    rec.add_argument("--out", required=True, help="reference directory to create")
    rec.add_argument("--steps", type=int, default=10, help="optimiser steps (default: %(default)s)")
    rec.add_argument("--batch", type=int, default=2, help="sequences per step (default: %(default)s)")
    rec.add_argument("--seq-len", type=int, default=32, help="tokens per sequence (default: %(default)s)")
    rec.add_argument("--data", default="random,real",
                     help="batch kinds: random tokens and/or windows of the prepared corpus (default: %(default)s)")
    rec.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    rec.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="default: %(default)s")
    rec.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    rec.add_argument("overrides", nargs="*", metavar="key=value",
                     help="run config overrides, e.g. model_overrides.dropout=0.1")
    rec.set_defaults(func=run_record)

    chk = sub.add_parser("check", help="replay a reference here and print the per-module comparison")
    chk.add_argument("--reference", required=True, help="directory written by `sigma numerics record`")
    chk.add_argument("--config", help="run preset this platform trains; must match the reference's model")
    chk.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    chk.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                     help="autocast dtype of the candidate (default: %(default)s); picks the thresholds")
    chk.add_argument("--data", help="only these batch kinds of the reference (comma-separated)")
    chk.add_argument("--min-cos", type=float, help="override the minimum cosine similarity for every module")
    chk.add_argument("--max-rel", type=float, help="override the maximum relative error for every module")
    chk.add_argument("--fault", help="inject a numerical fault by name (`sigma numerics faults`) into the candidate")
    chk.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    chk.add_argument("--json", action="store_true", help="print the result as JSON")
    chk.add_argument("--out", metavar="FILE", help="also write the JSON result to FILE")
    chk.set_defaults(func=run_check)

    flt = sub.add_parser("faults", help="list the numerical faults `check --fault` can inject")
    flt.set_defaults(func=run_faults)


def _fail(message: str) -> int:
    print(f"sigma numerics: error: {message}", file=sys.stderr)
    return 2


def run_record(args) -> int:
    import torch

    from sigma.config import ConfigError
    from sigma.train.numerics.record import DATA_KINDS, record
    from sigma.train.numerics.reference import NumericsError
    from sigma.train.train_config import load_train_config

    kinds = tuple(k for k in args.data.split(",") if k)
    bad = [k for k in kinds if k not in DATA_KINDS]
    if bad or not kinds:
        return _fail(f"--data {args.data}: use random and/or real")
    torch.set_num_threads(max(1, args.threads))
    try:
        cfg = load_train_config(args.config, args.overrides)
        meta = record(cfg, args.out, args.steps, args.batch, args.seq_len, kinds, args.device, args.dtype,
                      log=lambda m: print(m, file=sys.stderr))
    except (NumericsError, ConfigError, FileNotFoundError) as exc:
        return _fail(str(exc))
    print(f"reference written to {args.out}: {len(meta['units'])} units, {meta['steps']} steps of "
          f"{', '.join(meta['data'])} data on {meta['platform']} ({meta['dtype']}, {meta['seconds']} s)")
    return 0


def run_check(args) -> int:
    import contextlib

    import torch

    from sigma.config import ConfigError
    from sigma.train.numerics.check import check
    from sigma.train.numerics.faults import inject
    from sigma.train.numerics.reference import NumericsError
    from sigma.train.numerics.table import render, rows
    from sigma.train.train_config import load_train_config

    torch.set_num_threads(max(1, args.threads))
    if (args.min_cos is None) != (args.max_rel is None):
        return _fail("--min-cos and --max-rel go together")
    thresholds = None if args.min_cos is None else (args.min_cos, args.max_rel)
    try:
        config = load_train_config(args.config) if args.config else None
        data = [d for d in args.data.split(",") if d] if args.data else None
        with inject(args.fault) if args.fault else contextlib.nullcontext() as fault:
            result = check(args.reference, args.device, args.dtype, config, thresholds, data, fault,
                           log=None if args.json else lambda m: print(m, file=sys.stderr))
    except (NumericsError, ConfigError, FileNotFoundError) as exc:
        return _fail(str(exc))
    except ValueError as exc:  # an unknown fault name
        return _fail(str(exc))
    doc = json.dumps({**result.to_dict(), "table": rows(result)}, indent=1)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(doc + "\n")
    if args.json:
        print(doc)
    else:
        print(render(result))
    return 1 if result.flagged else 0


def run_faults(args) -> int:
    from sigma.train.numerics.faults import FAULTS

    for fault in FAULTS.values():
        print(f"{fault.name:<22} {fault.module:<20} {fault.what}")
    return 0
