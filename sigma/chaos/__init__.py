"""Fault injection at the source for tests, demos and soak runs on the local cluster."""
