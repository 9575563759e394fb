"""Tests of :mod:`nemo_rl_shim.cli`: the command (``status``, arguments) here; each subcommand in its folder."""
