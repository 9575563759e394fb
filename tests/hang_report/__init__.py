"""Tests of ``nemo-rl-shim hang-report``: real dumps, NCCL-format dumps, hostile dumps, stacks, call sites."""
