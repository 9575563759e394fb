"""Tests of :mod:`nemo_rl_shim.flight_recorder`: dumps from real stalls, and the stack watchdog."""
