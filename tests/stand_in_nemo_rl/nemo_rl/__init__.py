"""Stands in for NeMo RL (NVIDIA-NeMo/RL ``7ea279abf``) in this project's CI: only what ``preflight --setup nemo-rl``
calls, written here (no NeMo RL code), each module saying what it stands in for.

Why a stand-in: ``nemo-rl-shim preflight --setup nemo-rl`` runs NeMo RL's own set-up, and this project's CI has
no copy of NeMo RL (it is not a published package, and its lock needs git sources CI cannot reach). These
modules let the tests run the command's logic (finding NeMo RL, standing Gloo in for NCCL, making the worker's
later groups, auditing every group) on real Gloo ranks. The check on NeMo RL's own code, unpatched and with the
series of ``nemo_rl_shim/upstream/``, is the preflight step of ``scripts/nemo_rl_check.py``.

Put this tree's parent (``tests/stand_in_nemo_rl``) on ``PYTHONPATH`` to use it.
"""
