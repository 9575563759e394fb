"""Tests of :mod:`nemo_rl_shim.timeouts`: the phases, and the learned timeouts' rule and run."""
