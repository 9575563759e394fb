"""Tests of :mod:`nemo_rl_shim.one_line`: an exception's first line, a list of ranks."""
