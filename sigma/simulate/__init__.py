"""`sigma simulate`: the controller's own decision code on a virtual clock against a simulated SLURM, with failures
from a real trace or a model fitted to public failure data, beside a no-automation baseline."""
