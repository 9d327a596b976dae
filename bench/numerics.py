"""Numerical validation bench: every fault of the library against clean comparisons, on the `tiny` preset.

    .venv/bin/python bench/numerics.py [--config configs/train/tiny.yaml] [--steps 10] [--keep DIR]

Records a reference (fp32, 1 thread, dropout and router jitter on so the random-number faults have something to
break), then checks: fp32 with each fault injected, bf16 autocast with bf16 thresholds (clean), and fp32 at 2
threads (clean; last, as two threads on a loaded machine are the slowest). Prints caught / injected, attributed / injected, false flags / clean runs, and the seconds of each
check: wall-clock and CPU (the CPU seconds move less with the load of a shared machine).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sigma.train import data as data_mod  # noqa: E402
from sigma.train.config import load_model_config  # noqa: E402
from sigma.train.numerics.check import check  # noqa: E402
from sigma.train.numerics.faults import FAULTS, inject  # noqa: E402
from sigma.train.numerics.record import record  # noqa: E402
from sigma.train.train_config import load_train_config  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/train/tiny.yaml")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--keep", help="write the reference here instead of a temporary directory")
    p.add_argument("--data-dir", default="/tmp/sigma-numerics-data",
                   help="prepared corpus for the real-data batches (a small one is prepared here when missing)")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = load_train_config(args.config, ["model_overrides.dropout=0.1", "model_overrides.router_jitter=0.01",
                                          f"data.path={args.data_dir}/stdlib-{{tokenizer}}-{{vocab_size}}"])
    vocab = load_model_config(cfg.model, cfg.model_overrides).vocab_size
    data_path = cfg.data.resolved_path(vocab)
    if not (data_path / data_mod.META_NAME).exists():
        data_mod.prepare(data_path, max_mb=2, tokenizer=cfg.data.tokenizer, vocab_size=vocab)
    kinds = ("random", "real")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; torch "
          f"{torch.__version__}; {args.config}, {args.steps} steps of random and real (stdlib corpus) batches")
    with tempfile.TemporaryDirectory() as tmp:
        ref = Path(args.keep or Path(tmp) / "ref")
        t0 = time.perf_counter()
        record(cfg, ref, steps=args.steps, data=kinds, log=lambda m: None)
        print(f"record: {time.perf_counter() - t0:.1f} s", flush=True)
        caught = attributed = 0
        times, cpus = [], []
        for fault in FAULTS.values():
            cpu = time.process_time()
            with inject(fault.name) as state:
                result = check(ref, faults=state)
            cpus.append(time.process_time() - cpu)
            times.append(result.seconds)
            kinds_flagged = {result.units[n].kind for n in result.culprits}
            expected = set(fault.module.split(","))
            ok = bool(kinds_flagged) and kinds_flagged <= expected
            caught += bool(result.flagged)
            attributed += ok
            sub = next((result.units[n].subop for n in result.culprits if result.units[n].subop), None)
            first = min(result.units[n].first_step for n in result.culprits) if result.culprits else None
            print(f"fault {fault.name:<22} {'caught' if result.flagged else 'MISSED':<7} "
                  f"{'attributed' if ok else 'WRONG'}: {','.join(sorted(kinds_flagged)) or '-'} at step {first}"
                  + (f"; sub-operation {sub}" if sub else "") + f"; {result.seconds:.1f} s ({cpus[-1]:.1f} s CPU)",
                  flush=True)
        clean = []
        for label, threads, dtype in (("bf16 autocast", 1, "bfloat16"), ("fp32, 2 threads", 2, "float32")):
            torch.set_num_threads(threads)
            cpu = time.process_time()
            result = check(ref, dtype=dtype)
            cpu = time.process_time() - cpu
            torch.set_num_threads(1)
            clean.append(bool(result.flagged))
            worst = min(result.units.values(), key=lambda u: min(u.cos.values()))
            print(f"clean {label:<16} {'FLAGGED ' + ','.join(result.culprits) if result.flagged else 'pass':<10} "
                  f"worst {worst.name}: min cos {min(worst.cos.values()):.6f}, max rel "
                  f"{max(max(u.rel.values()) for u in result.units.values()):.2e}, router flips "
                  f"{100 * max(u.flips for u in result.units.values()):.1f}%; {result.seconds:.1f} s ({cpu:.1f} s CPU)",
                  flush=True)
    n = len(FAULTS)
    print(f"one tiny check (fp32, 1 thread, {len(kinds)} data kinds): {min(times):.1f}-{max(times):.1f} s wall, "
          f"{min(cpus):.1f}-{max(cpus):.1f} s CPU")
    print(f"caught {caught}/{n}, attributed {attributed}/{n}, false flags {sum(clean)}/{len(clean)}; "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0 if caught == attributed == n and not any(clean) else 1


if __name__ == "__main__":
    sys.exit(main())
