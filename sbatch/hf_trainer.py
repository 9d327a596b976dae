"""A Hugging Face Trainer job with the platform's protection: a tiny GPT-2 trained on synthetic tokens (no download),
two lines of sigma (watch, resume_checkpoint). Run one task per rank under srun (sbatch/hf-trainer.sbatch), or
alone: `python sbatch/hf_trainer.py --output-dir /tmp/hf-run --steps 30`.
"""

import argparse
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from sigma.integrations.hf import resume_checkpoint, watch
from sigma.integrations.torch import slurm_env


class Tokens(torch.utils.data.Dataset):
    """Deterministic synthetic sequences: a repeating pattern the model can learn, so the loss falls."""

    def __init__(self, n: int, seq_len: int, vocab: int):
        g = torch.Generator().manual_seed(0)
        starts = torch.randint(0, vocab, (n, 1), generator=g)
        self.ids = (starts + torch.arange(seq_len)) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class StepDelay(TrainerCallback):
    """Stands in for a bigger model's compute: every step takes at least this long."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output-dir", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--save-steps", type=int, default=20)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--fault-hooks", action="store_true", help="honour `sigma chaos nan` (testing only)")
    a = p.parse_args()
    slurm_env()  # RANK, WORLD_SIZE, MASTER_ADDR, ... from srun's task (torchrun sets them itself)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    torch.set_num_threads(1)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(output_dir=a.output_dir, max_steps=a.steps, per_device_train_batch_size=4,
                             learning_rate=3e-3, logging_steps=1, logging_nan_inf_filter=False, save_strategy="steps",
                             save_steps=a.save_steps, report_to=[], use_cpu=True, ddp_backend="gloo" if distributed else None,
                             dataloader_num_workers=0, disable_tqdm=True, seed=0, include_num_input_tokens_seen=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(4096, 32, 64),
                      callbacks=[StepDelay(a.step_delay)] if a.step_delay else [])
    watch(trainer, fault_hooks=a.fault_hooks)
    trainer.train(resume_from_checkpoint=resume_checkpoint(a.output_dir))


if __name__ == "__main__":
    main()
