"""Submit a training run through submitit: to SLURM when there is one, else as local processes.

Every rank runs `TrainTask`, which calls trainer.train(). Recovery needs no help from here:
- node failure / `scontrol requeue`: SLURM restarts the original submission, the trainer finds the newest
  complete checkpoint and resumes;
- timeout / preemption: submitit signals the job and calls `TrainTask.checkpoint`, which resubmits the same
  task (its requeue budget is `launch.max_requeues`); again the trainer resumes from its newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import submitit

from sigma.train.train_config import TrainConfig, check_layout, train_config_from_dict


class TrainTask(submitit.helpers.Checkpointable):
    """Picklable per-rank entry point; holds the config as plain data."""

    def __init__(self, config: dict):
        self.config = config

    def __call__(self) -> dict:
        from sigma.train.trainer import train

        summary = train(train_config_from_dict(self.config))
        return dataclasses.asdict(summary)

    # Checkpointable.checkpoint() resubmits this same task: the trainer itself resumes from disk, so saving
    # inside a signal handler (in the middle of collectives) is neither needed nor safe.


def slurm_available() -> bool:
    return bool(shutil.which("sbatch")) and (bool(os.environ.get("SLURM_CONF"))
                                             or Path("/etc/slurm/slurm.conf").exists()
                                             or Path("/etc/slurm-llnl/slurm.conf").exists())


def make_executor(cfg: TrainConfig) -> submitit.AutoExecutor:
    launch = cfg.launch
    kind = launch.executor
    if kind == "auto":
        kind = "slurm" if slurm_available() else "local"
    if kind == "local" and launch.nodes > 1:
        raise ValueError(f"launch.nodes={launch.nodes} needs SLURM; the local executor runs on one machine")
    folder = cfg.path(launch.folder)
    executor = submitit.AutoExecutor(folder=folder, cluster=kind, slurm_max_num_timeout=launch.max_requeues)
    params = {"name": f"sigma-{cfg.name}", "timeout_min": launch.timeout_min, "nodes": launch.nodes,
              "tasks_per_node": launch.gpus_per_node, "cpus_per_task": launch.cpus_per_task}
    if launch.mem_gb:
        params["mem_gb"] = launch.mem_gb
    if kind == "slurm":
        if cfg.device == "cuda":
            params["gpus_per_node"] = launch.gpus_per_node
        if launch.partition:
            params["slurm_partition"] = launch.partition
        # Node-failure requeue restarts the submission (submitit already appends to the logs of every attempt).
        params["slurm_additional_parameters"] = {"requeue": True}
    executor.update_parameters(**params)
    return executor


def submit(cfg: TrainConfig) -> submitit.Job:
    """Validate the layout, then submit one task per rank; returns the submitit job."""
    from sigma.train.config import load_model_config

    model_cfg = load_model_config(cfg.model, cfg.model_overrides)
    from sigma.train.parallelize import check_trainer_layout

    check_trainer_layout(check_layout(cfg, cfg.launch.world_size, model_cfg.n_experts), cfg.parallel.shard_optimizer)
    executor = make_executor(cfg)
    return executor.submit(TrainTask(cfg.to_dict()))
