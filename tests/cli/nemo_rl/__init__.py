"""Tests of :mod:`nemo_rl_shim.cli.nemo_rl`: a NeMo RL recipe read as NeMo RL reads it, and the training world."""
