"""`sigma train`: submit a training run, or prepare its data.

    sigma train --config configs/train/debug.yaml [--nodes N] [--gpus-per-node G] [key=value ...]
    sigma train prepare [--out DIR] [--source DIR] [--max-mb MB] [--shard-tokens N] [--tokenizer bpe|byte]
                        [--vocab-size V] [--eval-fraction F]
    sigma train calibrate [--threads 1,2] [--dtypes float32,bfloat16] [--runs N] [--seconds S] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys

USAGE = """sigma train --config CONFIG [--nodes N] [--gpus-per-node G] [--resume RUN] [--wait|--no-wait] [key=value ...]
       sigma train prepare [--out DIR] [--source DIR] [--max-mb MB] [--shard-tokens N] [--tokenizer bpe|byte]
                           [--vocab-size V] [--eval-fraction F]
       sigma train calibrate [--threads 1,2] [--dtypes float32,bfloat16] [--runs N] [--seconds S] [--out FILE]"""


def register(subparsers) -> None:
    # Two forms under one command: the arguments are parsed by the handler (`prepare` or a run submission).
    parser = subparsers.add_parser("train", help="submit an MoE training run (or `prepare` its data)",
                                   add_help=False, prefix_chars="\0", usage=USAGE)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    parser.set_defaults(func=run)


def submit_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sigma train", usage=USAGE,
                                description="Submit a training run through submitit (SLURM, or local processes "
                                            "when there is no SLURM). See docs/train.md.")
    p.add_argument("--config", required=True, help="run preset, e.g. configs/train/debug.yaml")
    p.add_argument("--nodes", type=int, help="SLURM nodes (launch.nodes)")
    p.add_argument("--gpus-per-node", type=int, help="ranks per node, one GPU each on GPU nodes "
                                                     "(launch.gpus_per_node)")
    p.add_argument("--resume", metavar="RUN",
                   help="continue run RUN from its newest checkpoint (default: a new run, named after the config's "
                        "`name`, then NAME-2, NAME-3, ...)")
    wait = p.add_mutually_exclusive_group()
    wait.add_argument("--wait", dest="wait", action="store_true", default=None,
                      help="wait for the run and print its summary (default for local runs)")
    wait.add_argument("--no-wait", dest="wait", action="store_false", help="return after submitting (SLURM default)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="config overrides, e.g. steps=20 parallel.ep=2 model_overrides.n_layers=4")
    return p


def prepare_parser() -> argparse.ArgumentParser:
    from sigma.train.train_config import DataConfig

    p = argparse.ArgumentParser(prog="sigma train prepare",
                                description="Train a BPE tokenizer on a corpus (default: this Python's standard "
                                            "library sources) and tokenize it into memory-mapped train and held-out "
                                            "shards. No downloads.")
    p.add_argument("--out", default=DataConfig.path.format(tokenizer="bpe", vocab_size=8192),
                   help="output directory (default: %(default)s)")
    p.add_argument("--source", help="directory of .py files (default: the Python standard library)")
    p.add_argument("--max-mb", type=float, default=16.0, help="corpus bytes to use, in MB (default: %(default)s)")
    p.add_argument("--shard-tokens", type=int, default=4_000_000, help="tokens per shard (default: %(default)s)")
    p.add_argument("--tokenizer", choices=("bpe", "byte"), default="bpe", help="default: %(default)s")
    p.add_argument("--vocab-size", type=int, default=8192, help="BPE vocabulary, the model's vocab_size "
                                                                "(default: %(default)s)")
    p.add_argument("--eval-fraction", type=float, default=0.05, help="documents held out for evaluation "
                                                                     "(default: %(default)s)")
    return p


def run(args) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "prepare":
        return run_prepare(prepare_parser().parse_args(argv[1:]))
    if argv and argv[0] == "calibrate":
        return run_calibrate(calibrate_parser().parse_args(argv[1:]))
    return run_submit(submit_parser().parse_args(argv))


def run_prepare(args) -> int:
    from sigma.train.data import prepare

    meta = prepare(args.out, args.source, max_mb=args.max_mb, shard_tokens=args.shard_tokens,
                   tokenizer=args.tokenizer, vocab_size=args.vocab_size, eval_fraction=args.eval_fraction)
    print(f"prepared {meta['train_tokens']:,} training tokens ({meta['train_documents']} files) and "
          f"{meta['eval_tokens']:,} held-out tokens ({meta['eval_documents']} files) from {meta['bytes']:,} bytes of "
          f"{meta['source']} into {args.out} (tokenizer {meta['tokenizer']}, vocab {meta['vocab_size']})")
    return 0


# ---------------------------------------------------------------- `sigma train calibrate`

def calibrate_parser() -> argparse.ArgumentParser:
    import os

    p = argparse.ArgumentParser(prog="sigma train calibrate",
                                description="Measure this CPU's GEMM peak once, on an idle machine, and record it "
                                            "with the CPU model: the fixed denominator of MFU on CPUs.")
    p.add_argument("--threads", default=",".join(sorted({"1", str(os.cpu_count() or 1)}, key=int)),
                   help="comma-separated torch thread counts (default: %(default)s)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="default: %(default)s")
    p.add_argument("--runs", type=int, default=5, help="runs per setting; the best is recorded (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=1.0, help="GEMMs per run, in seconds (default: %(default)s)")
    p.add_argument("--out", help="calibration file (default: $SIGMA_PEAK_FILE or ~/.cache/sigma/peak-flops.json)")
    return p


def run_calibrate(args) -> int:
    import datetime
    import os
    from pathlib import Path

    import torch

    from sigma.cli import CommandError
    from sigma.train.flops import cpu_model, measure_gemm_peak, peak_file, record_calibration

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    try:
        threads = [int(t) for t in args.threads.split(",")]
        chosen = [dtypes[d] for d in args.dtypes.split(",")]
    except (ValueError, KeyError):
        raise CommandError(f"--threads takes integers and --dtypes {', '.join(dtypes)}: got "
                           f"{args.threads!r}, {args.dtypes!r}") from None
    load = os.getloadavg()[0]
    busy = load > 0.25 * (os.cpu_count() or 1)
    model = cpu_model()
    print(f"calibrating {model}: load average {load:.2f} on {os.cpu_count()} CPUs"
          + (" -- NOT idle: other work lowers the peak and raises every MFU measured against it" if busy else ""))
    entries = []
    for n in threads:
        for dtype in chosen:
            rates = measure_gemm_peak(dtype, n, runs=args.runs, seconds=args.seconds)
            name = str(dtype).removeprefix("torch.")
            entries.append({"cpu": model, "threads": n, "dtype": name, "flops": max(rates), "runs": rates,
                            "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                            "load_average": round(load, 2), "torch": torch.__version__})
            print(f"  {n} thread(s) {name:9} best {max(rates) / 1e9:8.1f} GFLOP/s "
                  f"(runs: {', '.join(f'{r / 1e9:.1f}' for r in rates)})")
    path = record_calibration(entries, Path(args.out).expanduser() if args.out else peak_file())
    print(f"recorded in {path}")
    return 0


def load_config(args):
    """The run config; a bad `key=value` is reported as the command-line argument it is, not a YAML line."""
    from sigma.cli import CommandError
    from sigma.config import ConfigError
    from sigma.train.train_config import load_train_config

    overrides = list(args.overrides)
    if args.nodes is not None:
        overrides.append(f"launch.nodes={args.nodes}")
    if args.gpus_per_node is not None:
        overrides.append(f"launch.gpus_per_node={args.gpus_per_node}")
    load_train_config(args.config)  # the file's own errors carry its line numbers
    try:
        return load_train_config(args.config, overrides)
    except (ConfigError, ValueError) as exc:
        for item in overrides:  # find the argument at fault
            try:
                load_train_config(args.config, [item])
            except (ConfigError, ValueError) as one:
                message = str(one)
                if isinstance(one, ConfigError):
                    message = message.removeprefix(f"{one.where}: ")
                raise CommandError(f"command line `{item}`: {message}") from None
        raise CommandError(f"command line overrides {' '.join(overrides)}: {exc}") from None


def use_local_cluster(cfg) -> None:
    """With no SLURM configured, submit to this checkout's local cluster (`sigma cluster up`); refuse to fall back
    to local processes when that cluster exists but is down."""
    import os

    from sigma.cli import CommandError
    from sigma.slurm.cluster import LocalCluster

    if cfg.launch.executor != "auto" or os.environ.get("SLURM_CONF") or os.path.exists("/etc/slurm/slurm.conf"):
        return
    local = LocalCluster()
    if not local.conf.exists():
        return
    if not local.running():
        raise CommandError(f"the local SLURM cluster under {local.state_dir} is not running: start it with "
                           f"`sigma cluster up` (or run here without SLURM: launch.executor=local)")
    for key, value in local.env.items():
        os.environ.setdefault(key, value)


def run_submit(args) -> int:
    from sigma.cli import CommandError
    from sigma.train.launch import LaunchError, name_new_run, resume_run, submit

    cfg = load_config(args)
    use_local_cluster(cfg)
    command = f"sigma train --config {args.config}"
    try:
        cfg, note = (resume_run(cfg, args.resume, command), "") if args.resume else name_new_run(cfg, command)
        job = submit(cfg)
    except LaunchError as exc:
        raise CommandError(str(exc)) from None
    if note:
        print(note)
    kind = type(job).__module__.split(".")[1]  # submitit.slurm.slurm / submitit.local.local
    what = "resumed run" if args.resume else "new run"
    print(f"submitted {what} {cfg.name} as {kind} job {job.job_id} ({cfg.launch.nodes} node(s) x "
          f"{cfg.launch.gpus_per_node} rank(s)); checkpoints: {cfg.path(cfg.checkpoint.dir).absolute()}; "
          f"logs: {job.paths.stdout}", flush=True)
    wait = args.wait if args.wait is not None else kind == "local"
    if not wait:
        return 0
    try:
        summary = job.results()[0]  # rank 0 reports the run
    except Exception as exc:  # the job's own traceback is in its log
        raise CommandError(f"job {job.job_id} failed: {str(exc).strip().splitlines()[-1]}; "
                           f"see {job.paths.stderr}") from None
    if not summary["losses"]:  # e.g. a fixed checkpoint.dir whose run had already reached `steps`
        print(f"run {cfg.name} trained no step: it was already at step {summary['start_step']} of "
              f"steps={cfg.steps}; to train further: {command} --resume {cfg.name} steps={2 * cfg.steps}")
        return 0
    rates = summary["tokens_per_s"][1:] or summary["tokens_per_s"]
    last = max(summary["losses"])
    print(f"run {cfg.name} finished at step {summary['last_step']}; last loss {summary['losses'][last]:.4f}; "
          f"mean {sum(rates) / max(1, len(rates)):,.0f} tokens/s; KPIs: {summary['kpi_path']}")
    sys.stdout.flush()
    return 0
