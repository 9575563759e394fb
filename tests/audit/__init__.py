"""Tests of :mod:`nemo_rl_shim.audit`: every group torch holds, and where its timeout came from."""
