"""``nemo-rl-shim preflight``: run the real set-up on every rank and check every process group.

The rooms:

* :mod:`.options` - what to check, from a NeMo RL YAML and the flags, validated before any rank starts;
* :mod:`.results` - the typed data at the seams: a rank's parameters, a group row, a rank's result
  (checked or failed), JSON only where they cross a process or a Ray actor;
* :mod:`.rank_checks` - what every rank runs: the real ``setup_distributed``, the groups a worker makes later,
  then one row per group torch holds;
* :mod:`.nemo_rl_setup` - ``--setup nemo-rl``: NeMo RL's own ``setup_distributed`` (NCCL stood in by Gloo on CPU);
* :mod:`.later_groups` - the groups a NeMo RL worker makes after set-up, made as it makes them;
* :mod:`.group_rows` - which groups a rank lists (every group torch holds, the one seam) and each row, from the audit;
* :mod:`.runner` - the one interface of the four runners, who reports, and the rule "one rank per GPU, else
  2 CPU ranks" with the limits that refuse more;
* :mod:`.spawn` (local processes; :mod:`.one_gpu` with exactly one CUDA device: the CPU ranks and one rank on
  the GPU), :mod:`.join` (a torchrun/srun world), :mod:`.ray_actors` (``--ray``), :mod:`.dry_run` (``--dry-run``,
  on :mod:`.fake_backend`) - the runners;
* :mod:`.stuck` - the grace after a failure (one :class:`~.stuck.Grace` for every runner), and how a rank
  that does not finish is named;
* :mod:`.run` - :func:`run_preflight`: sizes the world, runs the runner, assembles the report;
* :mod:`.report` - what is wrong (one line) and the table or JSON.

Ranks: one per CUDA device when there are at least two; otherwise two CPU ranks on gloo (with
exactly one CUDA device it is hidden from them, since NCCL needs one device per rank, and one more rank
checks it in a world of its own: :mod:`.one_gpu`). With
a training world (the config's ``cluster`` section read with NeMo RL's rule, or ``--world``),
that many ranks when they fit, and :class:`~.options.WorldTooLarge` (exit 2, one line pointing
to ``--dry-run``) when they do not; ``--nproc`` always wins.

Embedded default (no ``--config``): ``distributed_timeout_minutes: 45``, no after-init value,
``patch_automodel: true``, CPU offload on, every parallel size 1 (dp = number of ranks). CPU
offload is on because it is the configuration the timeout regression is about, and because it
runs the ``full_tensor()`` check. On a CPU-only machine the default group is plain gloo and the
cpu-mesh-timeout workaround is applied with or without CPU offload, since 0.5.0-0.7.0's override
returns nothing for a non-CUDA mesh; with ``--no-patch`` the sub-groups the mesh build makes keep
gloo's 30-minute default, which preflight then reports.

CPU offload check: FSDP2 ``fully_shard`` with ``CPUOffloadPolicy`` on the ``dp`` mesh (it works
on a gloo mesh with torch 2.15, so CPU and GPU runs use the same code), then ``full_tensor()``
compared with the unsharded weight.

Fault injection, for tests only: ``stall_rank`` / ``stall_s`` (``--stall-rank``, ``--stall-s``,
hidden flags) make one rank sleep after set-up, so its peers wait in a collective on it. A
spawned run ends ``FAILURE_GRACE_S`` (:class:`.stuck.Grace`) after a peer's collective timed out on it
(``--timeout-minutes`` shorter than ``--timeout-s``), naming it; else at ``timeout_s``.
"""

from __future__ import annotations

from nemo_rl_shim.cli.preflight.join import detect_launcher
from nemo_rl_shim.cli.preflight.options import PreflightOptions, WorldTooLarge, build_options
from nemo_rl_shim.cli.preflight.report import PreflightReport, render_report
from nemo_rl_shim.cli.preflight.run import run_preflight

__all__ = [
    "PreflightOptions",
    "PreflightReport",
    "WorldTooLarge",
    "build_options",
    "detect_launcher",
    "render_report",
    "run_preflight",
]
