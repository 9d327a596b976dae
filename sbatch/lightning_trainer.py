"""A PyTorch Lightning job with the platform's protection: a small regression model on synthetic batches (no
download), two lines of sigma (the callback, resume_checkpoint). Run one task per rank under srun
(sbatch/lightning.sbatch), or alone: `python sbatch/lightning_trainer.py --ckpt-dir /tmp/pl-run --steps 30`.
"""

import argparse
import os
import time

import lightning.pytorch as pl
import torch

from sigma.integrations.lightning import SigmaCallback, resume_checkpoint
from sigma.integrations.torch import slurm_env


class Batches(torch.utils.data.Dataset):
    """The same sample for the same index on every run: a resumed run sees the data it would have seen."""

    def __len__(self):
        return 10**7

    def __getitem__(self, i):
        x = torch.randn(32, generator=torch.Generator().manual_seed(i))
        return x, x.sum(dim=0, keepdim=True).sin()


class Regression(pl.LightningModule):
    def __init__(self, step_delay: float):
        super().__init__()
        self.step_delay = step_delay
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))

    def training_step(self, batch, _):
        x, y = batch
        time.sleep(self.step_delay)  # stands in for a bigger model's compute
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--save-every", type=int, default=20)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--fault-hooks", action="store_true", help="honour `sigma chaos nan` (testing only)")
    a = p.parse_args()
    slurm_env()  # MASTER_ADDR and a MASTER_PORT of this job's run (Lightning reads the ranks from SLURM itself)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=a.ckpt_dir, every_n_train_steps=a.save_every, save_top_k=-1)
    trainer = pl.Trainer(max_steps=a.steps, accelerator="cpu", devices=1, num_nodes=int(os.environ.get("SLURM_NNODES", 1)),
                         strategy="ddp" if int(os.environ.get("SLURM_NTASKS", 1)) > 1 else "auto", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[checkpoints, SigmaCallback(fault_hooks=a.fault_hooks)])
    data = torch.utils.data.DataLoader(Batches(), batch_size=16)
    trainer.fit(Regression(a.step_delay), data, ckpt_path=resume_checkpoint(a.ckpt_dir))


if __name__ == "__main__":
    main()
