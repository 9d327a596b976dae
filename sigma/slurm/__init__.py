"""The only code that runs SLURM commands: typed results, actions, and the local cluster."""

from sigma.slurm.command import SlurmError, run

__all__ = ["SlurmError", "run"]
