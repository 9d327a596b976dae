"""A Hugging Face Trainer with and without sigma's callback, side by side, and a NaN caught on the same device.

    python bench/own_trainer.py [--device cuda] [--size small|tiny] [--steps 40] [--rounds 2]

Runs interleaved (plain, watched, plain, watched, ...), each a fresh GPT-2 trained on synthetic tokens for --steps
steps (bf16 on CUDA, fp32 on the CPU), timed from the end of step --skip to the last step with the device
synchronised at both ends. Prints tokens/s of each run and the watched/plain ratio of the medians. Then one watched
run where `sigma chaos nan`'s trigger file is written after step --skip: the callback must drop that step's update
(the weights equal the ones after step --skip), stop, and write its `nan_loss` event and a checkpoint.
The model: `small` is GPT-2 small (124 M parameters, 1,024 tokens a sequence), `tiny` a 2-layer toy for the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SIZES = {  # GPT2Config fields, batch, sequence length
    "small": (dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12), 16, 1024),
    "tiny": (dict(vocab_size=512, n_positions=128, n_embd=64, n_layer=2, n_head=2), 8, 128),
}


def _dataset(n: int, seq: int, vocab: int):
    import torch

    class Tokens(torch.utils.data.Dataset):
        def __init__(self):
            g = torch.Generator().manual_seed(0)
            self.ids = (torch.randint(0, vocab, (n, 1), generator=g) + torch.arange(seq)) % vocab

        def __len__(self):
            return n

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    return Tokens()


def one_run(device: str, size: str, steps: int, skip: int, out: Path, *, watched: bool, nan_after: int | None = None,
            seed: int = 0) -> dict:
    """Train once; return tokens/s over steps skip+1..steps (and, with nan_after, what the callback did)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    from sigma.integrations.hf import watch
    from sigma.kpi import NAN_TRIGGER

    fields, batch, seq = SIZES[size]
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(**fields))
    cuda = device == "cuda"
    marks: dict = {}

    def sync():
        if cuda:
            torch.cuda.synchronize()

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step in (skip, steps):
                sync()
                marks[state.global_step] = time.perf_counter()
            if nan_after is not None and state.global_step == nan_after:
                marks["weights"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
                (Path(sigma.run.path).parent / NAN_TRIGGER).write_text("")

    args = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=batch,
                             learning_rate=3e-4, logging_steps=1, logging_nan_inf_filter=False,
                             save_strategy="no", report_to=[], use_cpu=not cuda, bf16=cuda, seed=seed,
                             dataloader_num_workers=0, disable_tqdm=True, include_num_input_tokens_seen=True)
    trainer = Trainer(model=model, args=args, train_dataset=_dataset(batch * (steps + 1), seq, fields["vocab_size"]),
                      callbacks=[Clock()])
    trainer.remove_callback(PrinterCallback)  # a dict printed per step: noise here
    sigma = watch(trainer, fault_hooks=nan_after is not None, hold=False) if watched else None
    trainer.train()
    result = {"watched": watched}
    if skip in marks and steps in marks:
        result["tokens_per_s"] = round((steps - skip) * batch * seq / (marks[steps] - marks[skip]))
    if nan_after is not None:
        before = marks["weights"]
        now = trainer.model.state_dict()
        lines = [json.loads(line) for line in Path(sigma.run.path).read_text().splitlines()] if sigma.run.path else []
        result.update(stopped_on_nan=sigma.stopped_on_nan, steps_done=trainer.state.global_step,
                      weights_kept=all(torch.equal(before[k], now[k]) for k in before),
                      nan_event=any(r.get("event") == "nan_loss" for r in lines),
                      checkpoint=any(r.get("event") == "checkpoint" and r.get("kind") == "rollback" for r in lines))
    return result


def measure(device: str, size: str, steps: int, skip: int, rounds: int) -> dict:
    os.environ.setdefault("SLURM_JOB_ID", "1")  # sigma.kpi reports only inside a job
    with tempfile.TemporaryDirectory(prefix="sigma-own-trainer-") as tmp:
        os.environ["SIGMA_KPI_DIR"] = str(Path(tmp) / "kpi")
        runs = []
        for i in range(rounds):
            for watched in (False, True):
                runs.append(one_run(device, size, steps, skip, Path(tmp) / f"run-{i}-{int(watched)}", watched=watched))
                print(f"  {'watched' if watched else 'plain  '} {runs[-1]['tokens_per_s']:,} tok/s", flush=True)
        nan = one_run(device, size, steps, skip, Path(tmp) / "nan", watched=True, nan_after=skip)
    plain = statistics.median(r["tokens_per_s"] for r in runs if not r["watched"])
    watched = statistics.median(r["tokens_per_s"] for r in runs if r["watched"])
    return {"device": device, "size": size, "steps": steps, "skip": skip, "runs": runs,
            "plain_tokens_per_s": round(plain), "watched_tokens_per_s": round(watched),
            "watched_vs_plain": round(watched / plain, 3), "nan": nan,
            "nan_ok": bool(nan["stopped_on_nan"] and nan["weights_kept"] and nan["nan_event"] and nan["checkpoint"]
                           and nan["steps_done"] == skip + 1)}


def summary(r: dict) -> str:
    nan = r["nan"]
    return (f"HF Trainer {r['size']} on {r['device']}: plain {r['plain_tokens_per_s']:,} tok/s, with sigma's callback "
            f"{r['watched_tokens_per_s']:,} ({r['watched_vs_plain']:.3f}x); NaN after step {r['skip']}: "
            f"{'caught' if r['nan_ok'] else 'NOT handled'} (stopped {nan['stopped_on_nan']}, weights kept "
            f"{nan['weights_kept']}, nan_loss event {nan['nan_event']}, rollback checkpoint {nan['checkpoint']}, "
            f"steps done {nan['steps_done']})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--size", default=None, choices=tuple(SIZES), help="default: small on cuda, tiny on cpu")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the timing")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    r = measure(a.device, a.size or ("small" if a.device == "cuda" else "tiny"), a.steps, a.skip, a.rounds)
    print(summary(r))
    return 0 if r["nan_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
