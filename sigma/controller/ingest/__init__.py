"""Ingest: the HTTP server sidecars push to, and the verification and storage of their batches."""
