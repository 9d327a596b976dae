"""Node telemetry: declarative collectors (one module each), the node-local SQLite store, the push client and the
KPI protocol. `sigma sidecar` runs it; docs/telemetry.md describes the config, collectors and protocols."""
