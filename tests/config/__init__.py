"""Tests of :mod:`nemo_rl_shim.config`: every key of ``automodel_cfg``, accepted and refused; the example configs."""
