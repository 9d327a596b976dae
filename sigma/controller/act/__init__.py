"""Acting on findings: incidents, guard rails, the action journal and its SLURM executors, remediation."""
