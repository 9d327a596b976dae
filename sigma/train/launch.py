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
import socket
from pathlib import Path

import submitit

from sigma.train.train_config import TrainConfig, check_layout, train_config_from_dict


class TrainTask(submitit.helpers.Checkpointable):
    """Picklable per-rank entry point; holds the config as plain data."""

    def __init__(self, config: dict):
        self.config = config

    def __call__(self) -> dict:
        if self.config.get("launch", {}).get("exit_on_sigterm", True):
            from sigma.train.terminate import exit_on_sigterm

            exit_on_sigterm()  # after submitit's handlers (it ignores SIGTERM), so ours wins
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
    """Validate the layout and the request against SLURM, then submit one task per rank; returns the job."""
    from sigma.train.config import load_model_config

    model_cfg = load_model_config(cfg.model, cfg.model_overrides)
    check_layout(cfg, cfg.launch.world_size, model_cfg.n_experts)
    executor = make_executor(cfg)
    if executor.cluster == "slurm":
        check_partition(cfg)
    elif cfg.launch.world_size > 1 and "SIGMA_MASTER_PORT" not in os.environ:
        # the local executor's ranks inherit this process's environment: a port free now, not submitit's port
        # seeded from the job id, which another socket on this machine may hold (the ranks then wait forever)
        os.environ["SIGMA_MASTER_PORT"] = str(free_port())
        try:
            return executor.submit(TrainTask(cfg.to_dict()))
        finally:
            del os.environ["SIGMA_MASTER_PORT"]
    return executor.submit(TrainTask(cfg.to_dict()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class LaunchError(RuntimeError):
    """A run that cannot be submitted as asked; the message says what to do instead."""


# ---------- run names: a new submission trains a new run unless it resumes one by name ----------

def run_names(cfg: TrainConfig) -> list[str]:
    """Names of the runs with a checkpoint directory under cfg's checkpoint.dir template."""
    template = cfg.checkpoint.dir
    if "{name}" not in template:
        return []
    head, _, tail = template.partition("{name}")
    root = Path(head).expanduser()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / tail.lstrip("/")).is_dir() or (not tail and p.is_dir()))


def name_new_run(cfg: TrainConfig, command: str = "sigma train") -> tuple[TrainConfig, str]:
    """cfg with a run name whose checkpoint and log directories do not exist yet (NAME, NAME-2, NAME-3, ...), and
    a note for the user. A checkpoint.dir without {name} is one fixed run directory: every submission continues
    the run there, unless it is finished."""
    if "{name}" not in cfg.checkpoint.dir:
        done = _finished_step(cfg, cfg.path(cfg.checkpoint.dir), cfg.name, command)
        note = (f"continuing the run in {cfg.path(cfg.checkpoint.dir)} from step {done} (its checkpoint.dir has no "
                f"{{name}}: each submission continues it)") if done else ""
        return cfg, note
    base, n = cfg.name, 1
    while True:
        name = base if n == 1 else f"{base}-{n}"
        trial = dataclasses.replace(cfg, name=name)
        if not trial.path(cfg.checkpoint.dir).exists() and not trial.path(cfg.launch.folder).exists():
            return trial, ""
        n += 1


def resume_run(cfg: TrainConfig, run: str, command: str = "sigma train") -> TrainConfig:
    """cfg for continuing run `run`: it must exist and must not have reached cfg.steps already."""
    trial = dataclasses.replace(cfg, name=run)
    root = trial.path(cfg.checkpoint.dir)
    if not root.is_dir():
        known = run_names(cfg)
        raise LaunchError(f"no run {run!r}: {root} does not exist; runs: {', '.join(known) or 'none yet'}")
    _finished_step(cfg, root, run, command)
    return trial


def _finished_step(cfg: TrainConfig, root: Path, run: str, command: str) -> int:
    """The step of the newest complete checkpoint under root (0 without one); a run already at cfg.steps is an
    error that says how to extend it."""
    from sigma.train.checkpoint import latest_checkpoint, read_meta

    latest = latest_checkpoint(root)
    done = int(read_meta(latest)["step"]) if latest is not None else 0
    if done >= cfg.steps:
        raise LaunchError(f"run {run!r} is finished: it reached step {done} of steps={cfg.steps}; to train it "
                          f"further: {command} --resume {run} steps={max(done, cfg.steps) * 2}")
    return done


def check_partition(cfg: TrainConfig, slurm=None) -> None:
    """Refuse, before sbatch, a request the partition can never satisfy (SLURM would leave it pending forever),
    and an unreachable SLURM."""
    from sigma.slurm.client import Slurm
    from sigma.slurm.command import SlurmError

    slurm = slurm or Slurm()
    try:
        nodes = slurm.nodes()
    except SlurmError as exc:
        conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
        said = (exc.stderr.splitlines() or [""])[-1][:100]
        if said.startswith("SLURM reported errors"):  # sinfo --json's way of saying slurmctld did not answer
            said = "no answer from slurmctld"
        raise LaunchError(f"SLURM does not answer (SLURM_CONF={conf}: {said}): is the cluster up? The local one "
                          f"starts with `sigma cluster up`") from None
    launch = cfg.launch
    names = sorted({p for n in nodes for p in n.partitions})
    if launch.partition:
        if launch.partition not in names:
            raise LaunchError(f"no partition {launch.partition!r}; partitions: {', '.join(names)}")
        nodes = [n for n in nodes if launch.partition in n.partitions]
        partition = launch.partition
    else:
        partition = names[0] if len(names) == 1 else "any partition"
    cpus = max((n.cpus for n in nodes), default=0)
    limits = f"partition {partition} has {len(nodes)} node(s) ({','.join(n.name for n in nodes)}), " \
             f"{cpus} CPUs per node"
    if launch.nodes > len(nodes):
        raise LaunchError(f"--nodes {launch.nodes} can never run: {limits}; ask for at most {len(nodes)}")
    need = launch.gpus_per_node * launch.cpus_per_task
    if need > cpus:
        raise LaunchError(f"{launch.gpus_per_node} rank(s) per node x launch.cpus_per_task={launch.cpus_per_task} "
                          f"= {need} CPUs per node can never run: {limits}")
