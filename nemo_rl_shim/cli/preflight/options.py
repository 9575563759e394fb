"""What ``nemo-rl-shim preflight`` checks, read from a NeMo RL YAML and the flags, validated before any rank starts.

A config is read as NeMo RL reads it (:mod:`nemo_rl_shim.cli.nemo_rl.recipe`: ``defaults:``
chains, ``_override_``, Hydra overrides, resolvers), and the training world it asks for is
computed with NeMo RL's rule (:mod:`nemo_rl_shim.cli.nemo_rl.training_world`), or set with ``--world``.

Shared by the runners (:mod:`nemo_rl_shim.cli.preflight.runner`) and the report
(:mod:`nemo_rl_shim.cli.preflight.report`), so neither imports the other.
"""

from __future__ import annotations

import copy
import importlib.util
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_rl_shim import config as cfg
from nemo_rl_shim.cli.nemo_rl import read_config, training_world_of, worker_note
from nemo_rl_shim.cli.preflight.later_groups import refit_gpus_per_engine
from nemo_rl_shim.cli.preflight.results import NEMO_RL_SETUP, SETUPS, SHIM_SETUP, RankParams
from nemo_rl_shim.setup.distributed import parallel_sizes

__all__ = [
    "DEFAULT_SECTION",
    "DEFAULT_TIMEOUT_S",
    "MIN_RANKS",
    "RAY_EXTRA_MISSING",
    "PreflightOptions",
    "WorldTooLarge",
    "build_options",
    "ranks_for_world",
]

MIN_RANKS = 2
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_SECTION: dict[str, Any] = {
    "automodel_cfg": {"distributed_timeout_minutes": 45.0},
    cfg.SHIM_CFG: {"patch_automodel": True},
    "dtensor_cfg": {"cpu_offload": True},
}


@dataclass(frozen=True)
class PreflightOptions:
    """What to check: the role's section as ``setup_distributed`` receives it, and how to run."""

    section: dict[str, Any]
    role: cfg.Role = "policy"
    cpu_offload: bool = True
    nproc: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    stall_rank: int | None = None
    stall_s: float = 0.0
    #: ``--ray``: the Ray cluster to run on (``"auto"`` or an address); None runs without Ray.
    ray_address: str | None = None
    #: The training world the config asks for (NeMo RL's rule on its ``cluster`` section) or ``--world``;
    #: None when neither is given.
    world_size: int | None = None
    #: Where ``world_size`` came from, in words (``"cluster.num_nodes 2 x cluster.gpus_per_node 8 = 16 (...)"``).
    world_source: str | None = None
    #: ``--dry-run``: check the world in this process on torch's fake backend (:mod:`.dry_run`).
    dry_run: bool = False
    #: ``--ranks all``: a dry run checks every rank, not a sample that covers every group shape.
    all_ranks: bool = False
    #: Set when the config runs this role on a worker that does not build Automodel's meshes
    #: (:func:`nemo_rl_shim.cli.nemo_rl.worker_note`); the report shows it.
    worker_note: str | None = None
    #: ``--setup``: whose ``setup_distributed`` every rank runs (:data:`~.results.SETUPS`).
    setup: str = SHIM_SETUP
    #: The command's whole ``--timeout-s`` where the ranks were given only what was left of it (``timeout_s``):
    #: :func:`~nemo_rl_shim.cli.preflight.run.run_preflight` sets it; None where ``timeout_s`` is the whole bound.
    timeout_whole_s: float | None = None

    @property
    def timeout_minutes(self) -> float | None:
        """The configured start-up timeout (``distributed_timeout_minutes``)."""
        return cfg.distributed_timeout_minutes(cfg.knobs({self.role: self.section}, self.role), self.role)

    @property
    def timeout_minutes_after_init(self) -> float | None:
        """The configured steady-state timeout (``distributed_timeout_minutes_after_init``)."""
        return cfg.distributed_timeout_minutes_after_init(cfg.knobs({self.role: self.section}, self.role), self.role)

    @property
    def flight_recorder(self) -> cfg.FlightRecorderSettings | None:
        """The configured Flight Recorder (``nemo_rl_shim.flight_recorder``), None when off."""
        return cfg.flight_recorder(cfg.knobs({self.role: self.section}, self.role), self.role)

    def rank_params(self) -> RankParams:
        """What every rank's :func:`~nemo_rl_shim.cli.preflight.rank_checks.check_rank` receives."""
        return RankParams(
            self.section, self.role, self.cpu_offload, self.stall_rank, self.stall_s, self.dry_run, self.setup
        )


#: The flags that set a knob: flag -> key (:func:`nemo_rl_shim.config.full_key` says which block holds it).
_KNOB_OVERRIDES = {
    "timeout_minutes": "distributed_timeout_minutes",
    "timeout_minutes_after_init": "distributed_timeout_minutes_after_init",
    "flight_recorder": "flight_recorder",  # --flight-recorder DIR: {enabled: true, dump_dir: DIR}
}
_DTENSOR_OVERRIDES = {
    "tp": "tensor_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_parallel_size",
    "dp_replicate": "dp_replicate_size",
    "cpu_offload": "cpu_offload",
}


def _base_section(config: Mapping[str, Any] | None, config_path: str | None, role: cfg.Role) -> dict[str, Any]:
    if config is None:
        return copy.deepcopy(DEFAULT_SECTION)
    section = config.get(role)
    if not isinstance(section, Mapping):
        raise ValueError(f"{config_path} must have a {role} section (a mapping), got {section!r}")
    return copy.deepcopy(dict(section))


class WorldTooLarge(ValueError):
    """The config's training world does not fit where preflight would run its ranks."""


def ranks_for_world(options: PreflightOptions, capacity: int, here: str) -> int | None:
    """How many ranks to run for ``options`` where ``capacity`` ranks fit (``here`` says what they are).

    ``--nproc`` wins when given. Otherwise a configured world that fits is run as is (at least
    :data:`MIN_RANKS`); None (no world) leaves the runner's default. A world larger than
    ``capacity`` raises :class:`WorldTooLarge`: one line, pointing to ``--dry-run``.
    """
    if options.nproc is not None or options.world_size is None:
        return options.nproc
    if options.world_size > capacity:
        elsewhere = (
            f"on a Ray cluster with {options.world_size} GPUs" if options.ray_address else "on the cluster with --ray"
        )
        raise WorldTooLarge(
            f"the config asks for {options.world_size} training ranks, from {options.world_source}; {here}: "
            f"check that layout with --dry-run, or run {elsewhere} (--world N or --nproc N checks N ranks here "
            "instead)"
        )
    return max(options.world_size, MIN_RANKS)


def _apply_flags(section: dict[str, Any], role: cfg.Role, overrides: Mapping[str, Any], patch: bool) -> bool:
    """The flags' ``overrides`` written into ``section`` (in place), then the section checked; its ``cpu_offload``."""
    cfg.knobs({role: section}, role)  # both blocks hold only known keys (the flags add only known ones)
    blocks = {name: dict(section.get(name) or {}) for name in ("automodel_cfg", cfg.SHIM_CFG)}
    section.update(blocks)
    dtensor = section["dtensor_cfg"] = dict(section.get("dtensor_cfg") or {})
    for key, value in overrides.items():
        if value is None:
            continue
        if key in _KNOB_OVERRIDES:
            knob = _KNOB_OVERRIDES[key]
            blocks[cfg.block_of(knob)][knob] = value
        elif key in _DTENSOR_OVERRIDES:
            dtensor[_DTENSOR_OVERRIDES[key]] = value
        else:
            raise ValueError(f"unknown preflight override {key!r}")
    if not patch:
        blocks[cfg.SHIM_CFG]["patch_automodel"] = False
    automodel, knobs = blocks["automodel_cfg"], cfg.knobs({role: section}, role)
    steady = cfg.distributed_timeout_minutes_after_init(knobs, role)  # checks the start-up value too
    cfg.patch_automodel(knobs, role)
    cfg.flight_recorder(knobs, role)  # makes the dump directory and checks it is writable
    cfg.learned_timeouts(knobs, role)
    sizes = parallel_sizes(dtensor, f"{role}.dtensor_cfg")
    # One read of every number (nemo_rl_shim.config.numbers): the plain values checked are the ones every rank gets.
    if automodel.get("distributed_timeout_minutes") is not None:
        automodel["distributed_timeout_minutes"] = cfg.distributed_timeout_minutes(knobs, role)
    if steady is not None:
        blocks[cfg.SHIM_CFG]["distributed_timeout_minutes_after_init"] = steady
    for flag, key in _DTENSOR_OVERRIDES.items():
        if flag != "cpu_offload" and dtensor.get(key) is not None:
            dtensor[key] = getattr(sizes, flag)
    cpu_offload = dtensor.get("cpu_offload", False)
    if not isinstance(cpu_offload, bool):
        raise ValueError(f"{role}.dtensor_cfg.cpu_offload must be true or false, got {cpu_offload!r}")
    return cpu_offload


#: The ``nemo_rl_shim`` keys that change what a set-up does: NeMo RL's own set-up reads none of them, so it cannot be
#: checked against them (``patch_automodel`` only says whether the shim may patch; NeMo RL's never does).
_SHIM_ONLY_KEYS = ("distributed_timeout_minutes_after_init", "learned_timeouts", "flight_recorder")


def _check_setup(setup: str, section: Mapping[str, Any], role: cfg.Role, deadline: float) -> None:
    """``--setup``: a known one; for NeMo RL's, NeMo RL importable here (tried before ``deadline``) and no key only
    the shim reads."""
    if setup not in SETUPS:
        raise ValueError(f"--setup must be one of {', '.join(SETUPS)}, got {setup!r}")
    if setup != NEMO_RL_SETUP:
        return
    from nemo_rl_shim.cli.preflight.nemo_rl_setup import nemo_rl_missing

    missing = nemo_rl_missing(timeout_s=deadline - time.monotonic())
    if missing is not None:
        raise ValueError(missing)
    shim = section.get(cfg.SHIM_CFG) or {}
    for key in _SHIM_ONLY_KEYS:
        value = shim.get(key)
        if value is not None and not (key == "flight_recorder" and not value.get("enabled")):
            raise ValueError(
                f"{cfg.full_key(role, key)} is {value!r}, but --setup nemo-rl runs NeMo RL's own set-up, which reads "
                "only distributed_timeout_minutes: remove the key (or its flag), or check the shim's set-up "
                "(--setup shim)"
            )


#: The one line where ``--ray`` is asked for and Ray is not installed.
RAY_EXTRA_MISSING = "--ray needs the ray extra: uv sync --extra ray"


def _check_ray(address: str | None) -> None:
    """``--ray``: an address, and Ray installed (found, not imported: the runner imports it)."""
    if address is None:
        return
    if not address.strip():
        raise ValueError(f"--ray takes 'auto' or a cluster address (host:port), got {address!r}")
    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # a broken or half-removed install: the same advice
        found = False
    if not found:
        raise ValueError(RAY_EXTRA_MISSING)


def build_options(
    config_path: str | None = None,
    role: cfg.Role = "policy",
    *,
    overrides: Mapping[str, Any] | None = None,
    patch: bool = True,
    nproc: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    stall_rank: int | None = None,
    stall_s: float = 0.0,
    ray_address: str | None = None,
    recipe_overrides: Sequence[str] = (),
    world: int | None = None,
    setup: str = SHIM_SETUP,
    config: Mapping[str, Any] | None = None,
    deadline: float | None = None,
) -> PreflightOptions:
    """Options from a NeMo RL YAML (its ``role`` section) or the embedded default, then ``overrides``.

    The YAML is read as NeMo RL reads it, with ``recipe_overrides`` (Hydra's ``key=value``,
    ``+key=value``, ``++key=value``, ``~key``) applied before the flags' ``overrides``; errors are
    :class:`nemo_rl_shim.cli.nemo_rl.recipe.RecipeError` (a ``ValueError``). ``world`` (``--world``) sets the
    training world; without it the config's ``cluster`` section gives it, with NeMo RL's rule.

    ``overrides`` keys: ``timeout_minutes``, ``timeout_minutes_after_init``, ``cpu_offload``,
    ``tp``, ``cp``, ``ep``, ``dp_replicate``; None values are ignored. ``patch=False`` sets
    ``nemo_rl_shim.patch_automodel: false``. Everything is validated here, before any rank
    starts; errors are ``ValueError`` naming the key and the value. ``setup`` (``--setup``): the shim's set-up,
    or NeMo RL's own, refused where NeMo RL is not importable and with keys only the shim reads.

    ``config``: the recipe at ``config_path`` already read, with ``recipe_overrides``
    (:func:`~nemo_rl_shim.cli.nemo_rl.read_config`; the command reads it before it imports torch); else it is read
    here. ``deadline`` (``time.monotonic()``; default ``timeout_s`` from now): what reading the recipe and trying
    NeMo RL's import may take, each in a child process (``--timeout-s`` bounds the whole command).
    """
    if role not in cfg.ROLES:
        raise ValueError(f"role must be one of {', '.join(cfg.ROLES)}, got {role!r}")
    if not timeout_s > 0:
        raise ValueError(f"--timeout-s must be a positive number of seconds, got {timeout_s!r}")
    deadline = time.monotonic() + timeout_s if deadline is None else deadline
    if config is None:
        config = read_config(config_path, recipe_overrides, timeout_s=deadline - time.monotonic())
    section = _base_section(config, config_path, role)
    training = training_world_of(config, role, world)
    cpu_offload = _apply_flags(section, role, overrides or {}, patch)
    _check_setup(setup, section, role, deadline)
    refit_gpus_per_engine(section, role)  # the SGLang refit groups' size, if any: checked before any rank
    if nproc is not None and nproc < MIN_RANKS:
        raise ValueError(f"--nproc must be at least {MIN_RANKS}, got {nproc}")
    _check_ray(ray_address)
    return PreflightOptions(
        section, role, cpu_offload, nproc, float(timeout_s), stall_rank, float(stall_s), ray_address,
        world_size=training.size if training else None, world_source=training.source if training else None,
        worker_note=worker_note(section, role) if config_path is not None else None, setup=setup,
    )  # fmt: skip
