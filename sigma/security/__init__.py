"""Who may speak for a node: per-node ingest keys (keys.py) and the `sigma keys` admin command (cli.py)."""
