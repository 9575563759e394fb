"""The Ray harness: a private Ray tree (``tree``), the scenarios run in it (``python -m tests.ray_harness.scenarios``)
and the preflight driver each scenario starts (``python -m tests.ray_harness.preflight_driver``)."""
