"""One module per collector; each registers itself by name with sigma.telemetry.base.register."""
