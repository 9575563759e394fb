"""Tests of the NeMo RL pull request (``nemo_rl_shim/upstream/``) and of ``scripts/nemo_rl_check.py``."""
