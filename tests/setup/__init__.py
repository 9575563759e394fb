"""Tests of :mod:`nemo_rl_shim.setup`: ``setup_distributed``, its context, the decision, the supported pairs, faults."""
