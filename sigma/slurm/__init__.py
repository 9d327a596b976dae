"""The only code that runs SLURM commands: typed results, actions, and the local cluster."""

from sigma.slurm.command import SlurmError, run
from sigma.slurm.formats.fields import SlurmFormatError

__all__ = ["SlurmError", "SlurmFormatError", "run"]
