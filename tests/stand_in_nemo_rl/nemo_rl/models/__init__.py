"""Part of the NeMo RL stand-in (see ``nemo_rl/__init__.py``)."""
