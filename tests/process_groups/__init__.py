"""Tests of :mod:`nemo_rl_shim.process_groups`: groups made later, setting a timeout and reading it back."""
