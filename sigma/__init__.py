"""Sigma for SLURM: keep GPU training clusters productive."""

__version__ = "0.1.0"
