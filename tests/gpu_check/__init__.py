"""Tests of the GPU run (scripts/gpu_check.sh, scripts/gpu_wheels.sh), its harvest of real NCCL dumps, and the
committed dumps (tests/fixtures/real_nccl/)."""
