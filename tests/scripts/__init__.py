"""Scripts run as ``python -m tests.scripts.<name>``: the GPU checks (scripts/gpu_check.sh) and fact reports."""
