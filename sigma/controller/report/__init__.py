"""The figures: `sigma report` and GET /metrics, computed from the controller database."""
