"""Benchmarks: start-up cost, process groups and hang detection of the shim (CPU, gloo ranks)."""
