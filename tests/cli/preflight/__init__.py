"""Tests of ``nemo-rl-shim preflight``: local ranks, the dry run, NeMo RL's set-up, Ray, the launcher."""
