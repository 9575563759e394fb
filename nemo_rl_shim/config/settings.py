"""The knob's two blocks, ``automodel_cfg`` and ``nemo_rl_shim``, and their validation.

A role's section (``policy``, or ``value`` for PPO) holds them side by side:

* ``automodel_cfg`` is NeMo RL's block. Its one key, ``distributed_timeout_minutes``, is the upstream knob; once
  NeMo RL takes the pull request in :mod:`nemo_rl_shim.upstream`, its ``AutomodelConfig`` (``extra="forbid"``)
  refuses any other key there, in the driver, before Ray starts a worker.
* ``nemo_rl_shim`` holds this package's own keys. NeMo RL's ``MasterConfig`` is ``extra="allow"`` and its
  ``PolicyConfig``/``ValueConfig`` TypedDicts take that config, so it accepts the block and hands it to the worker
  with the rest of the section (see ``docs/into-nemo-rl.md``, "Where the shim's keys live").

Knows nothing of torch.distributed: every check here runs before any process group exists, so a bad value leaves
nothing half-initialized.
"""

from __future__ import annotations

import datetime
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

from nemo_rl_shim.config.numbers import plain_float, plain_int, shown

__all__ = [
    "AUTOMODEL_CFG_KEYS",
    "FLIGHT_RECORDER_DEFAULTS",
    "LEARNED_TIMEOUTS_DEFAULTS",
    "MIN_TIMEOUT",
    "ROLES",
    "SHIM_CFG",
    "SHIM_CFG_KEYS",
    "AutomodelConfig",
    "FlightRecorderSettings",
    "LearnedTimeoutsSettings",
    "Role",
    "ShimConfig",
    "automodel_cfg",
    "block_of",
    "blocks",
    "distributed_timeout_minutes",
    "distributed_timeout_minutes_after_init",
    "flight_recorder",
    "full_key",
    "knobs",
    "learned_timeouts",
    "minutes_timedelta",
    "patch_automodel",
    "shim_cfg",
]

Role = Literal["policy", "value"]
ROLES: tuple[Role, ...] = ("policy", "value")

# The largest minute count datetime.timedelta accepts (999,999,999 days).
_MAX_MINUTES = datetime.timedelta.max.total_seconds() / 60
#: The smallest timeout a process group keeps: torch stores timeouts in whole milliseconds,
#: so anything shorter becomes 0 and every collective would time out at once.
MIN_TIMEOUT = datetime.timedelta(milliseconds=1)

#: The block, beside ``automodel_cfg`` in a role's section, that holds this package's own keys.
SHIM_CFG = "nemo_rl_shim"


class AutomodelConfig(TypedDict):
    """``policy.automodel_cfg`` (and, for PPO, ``value.automodel_cfg``): NeMo RL's block, its one key."""

    #: Timeout of the default process group and of every DeviceMesh sub-group, in
    #: minutes. None (or unset) keeps torch's defaults: 10 min for NCCL, 30 for Gloo.
    distributed_timeout_minutes: NotRequired[float | None]


class ShimConfig(TypedDict):
    """``policy.nemo_rl_shim`` (and, for PPO, ``value.nemo_rl_shim``): the keys only this package reads."""

    #: Steady-state timeout once the first training step has finished. None keeps
    #: ``automodel_cfg.distributed_timeout_minutes`` for the whole run. May not exceed it.
    distributed_timeout_minutes_after_init: NotRequired[float | None]
    #: Apply the workaround the run's default group needs (keep-cpu-backend under CPU offload,
    #: cpu-mesh-timeout on a CPU-only machine) where the installed release still needs it.
    #: Default True. With False under CPU offload the timeout is not forwarded there.
    patch_automodel: NotRequired[bool]
    #: torch's Flight Recorder: ``{enabled: false, dump_dir: null, buffer_size: 2000}``. Off by default.
    #: On, every rank records its last ``buffer_size`` collectives and writes them to ``dump_dir`` when a
    #: collective times out (see :mod:`nemo_rl_shim.flight_recorder`; read with ``nemo-rl-shim hang-report``).
    flight_recorder: NotRequired[Mapping[str, Any] | None]
    #: Timeouts learned from the run's own step and phase times: ``{factor: 5, min_steps: 8, floor_minutes: 1}``.
    #: Off by default. On, ``automodel_cfg.distributed_timeout_minutes`` is required (the ceiling) and
    #: ``distributed_timeout_minutes_after_init`` is refused (choose one); see
    #: :mod:`nemo_rl_shim.timeouts.learned_rule`.
    learned_timeouts: NotRequired[Mapping[str, Any] | None]


#: Every key ``automodel_cfg`` may hold (:class:`AutomodelConfig`): NeMo RL's, and only NeMo RL's.
AUTOMODEL_CFG_KEYS: tuple[str, ...] = ("distributed_timeout_minutes",)
#: Every key ``nemo_rl_shim`` may hold (:class:`ShimConfig`); any other is refused by :func:`shim_cfg`.
#: A new key of this package's is added here, and to :class:`ShimConfig`, and nowhere else.
SHIM_CFG_KEYS: tuple[str, ...] = (
    "distributed_timeout_minutes_after_init",
    "patch_automodel",
    "flight_recorder",
    "learned_timeouts",
)


def block_of(key: str) -> str:
    """The block of a role's section that holds ``key``: ``automodel_cfg`` for NeMo RL's key, else ``nemo_rl_shim``."""
    return "automodel_cfg" if key in AUTOMODEL_CFG_KEYS else SHIM_CFG


def full_key(where: str, key: str) -> str:
    """The full name of ``key`` in the role section ``where`` (``policy``): ``policy.automodel_cfg.<key>`` for
    NeMo RL's key, ``policy.nemo_rl_shim.<key>`` for this package's (:func:`block_of`)."""
    return f"{where}.{block_of(key)}.{key}"


def blocks(knobs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A flat mapping of knobs (as :func:`knobs` returns) split back into a role section's two blocks, each key in
    its :func:`block_of`; both blocks present, empty where no key goes. The inverse of :func:`knobs`, for code
    that builds a section."""
    out: dict[str, dict[str, Any]] = {"automodel_cfg": {}, SHIM_CFG: {}}
    for key, value in knobs.items():
        out[block_of(key)][key] = value
    return out


def _block(config: Mapping[str, Any], role: str, name: str) -> Mapping[str, Any]:
    """``config[role][name]``, or an empty mapping when either is absent or null; ValueError if not a mapping."""
    section = config.get(role) or {}
    if not isinstance(section, Mapping):
        raise ValueError(f"{role} must be a mapping, got {section!r}")
    block = section.get(name) or {}
    if not isinstance(block, Mapping):
        raise ValueError(f"{role}.{name} must be a mapping, got {block!r}")
    return block


def automodel_cfg(config: Mapping[str, Any], role: Role = "policy") -> Mapping[str, Any]:
    """``config[role]["automodel_cfg"]``, or an empty mapping when either is absent or null.

    One of this package's keys there (its place before NeMo RL had ``AutomodelConfig``) raises ``ValueError``
    naming the full old key, the new one and the value: patched NeMo RL refuses it there (``extra="forbid"``),
    and a key read from two places would need a rule for which wins. Any other key (a misspelt
    ``distributed_timeout_minute``) raises naming the full key, its value and the known keys: dropped silently,
    it would leave the run at torch's defaults with no word.
    """
    block = _block(config, role, "automodel_cfg")
    for key in block:
        if key in SHIM_CFG_KEYS:
            raise ValueError(
                f"{role}.automodel_cfg.{key} has moved to {role}.{SHIM_CFG}.{key} (NeMo RL's automodel_cfg holds "
                f"only {', '.join(AUTOMODEL_CFG_KEYS)} and refuses any other key), got {block[key]!r}"
            )
    unknown = sorted((key for key in block if key not in AUTOMODEL_CFG_KEYS), key=str)
    if unknown:
        raise ValueError(
            f"{role}.automodel_cfg.{unknown[0]} is not an automodel_cfg key (known: {', '.join(AUTOMODEL_CFG_KEYS)}; "
            f"this package's own keys go in {role}.{SHIM_CFG}), got {block[unknown[0]]!r}"
        )
    return block


def shim_cfg(config: Mapping[str, Any], role: Role = "policy") -> Mapping[str, Any]:
    """``config[role]["nemo_rl_shim"]``, or an empty mapping when either is absent or null.

    A key that is not in :data:`SHIM_CFG_KEYS` raises ``ValueError`` naming the full key, its value and the known
    keys; ``distributed_timeout_minutes`` there is pointed back to ``automodel_cfg``, NeMo RL's block.
    """
    block = _block(config, role, SHIM_CFG)
    unknown = sorted((key for key in block if key not in SHIM_CFG_KEYS), key=str)
    if unknown:
        key = unknown[0]
        where = f" (it is NeMo RL's key: set {role}.automodel_cfg.{key})" if key in AUTOMODEL_CFG_KEYS else ""
        raise ValueError(
            f"{role}.{SHIM_CFG}.{key} is not a {SHIM_CFG} key (known: {', '.join(SHIM_CFG_KEYS)}){where}, "
            f"got {block[key]!r}"
        )
    return block


def knobs(config: Mapping[str, Any], role: Role = "policy") -> dict[str, Any]:
    """Both blocks of ``config[role]``, each checked (:func:`automodel_cfg`, :func:`shim_cfg`), as one mapping:
    what the validators below read, with ``where=role``. Their keys never overlap."""
    return {**automodel_cfg(config, role), **shim_cfg(config, role)}


def _positive_minutes(value: Any, key: str) -> float | None:
    """``value`` read once as a plain float (:func:`~nemo_rl_shim.config.numbers.plain_float`), then checked: the
    float returned is the one checked."""
    if value is None:
        return None
    rule = f"{key} must be a positive number of minutes"
    # bool is an int subclass: True would silently mean one minute (plain_float refuses it).
    minutes = plain_float(value)
    if minutes is None:
        raise ValueError(f"{rule}, got {shown(value)} ({type(value).__name__})")
    if math.isnan(minutes) or math.isinf(minutes) or minutes <= 0:
        raise ValueError(f"{rule}, got {shown(value)}")
    if minutes > _MAX_MINUTES:
        raise ValueError(f"{rule} no larger than {_MAX_MINUTES:.0f} (datetime.timedelta's limit), got {shown(value)}")
    try:
        timeout = datetime.timedelta(minutes=minutes)
    except OverflowError as e:
        raise ValueError(f"{rule} that datetime.timedelta can hold, got {shown(value)}") from e
    if timeout < MIN_TIMEOUT:
        raise ValueError(
            f"{rule}, got {shown(value)}: that is {timeout.total_seconds() * 1000:g} ms, and torch keeps process-group "
            "timeouts in whole milliseconds, so it would be 0 and every collective would time out at once"
        )
    return minutes


def minutes_timedelta(value: Any, key: str) -> datetime.timedelta:
    """``value`` minutes as a timedelta of at least :data:`MIN_TIMEOUT`; ValueError naming ``key`` otherwise."""
    minutes = _positive_minutes(value, key)
    if minutes is None:
        raise ValueError(f"{key} must be a positive number of minutes, got None")
    return datetime.timedelta(minutes=minutes)


def distributed_timeout_minutes(cfg: Mapping[str, Any], where: str = "policy") -> float | None:
    """The validated ``automodel_cfg.distributed_timeout_minutes`` of a role's :func:`knobs` (``where``: the role).

    Unset or null gives None (torch's default). Zero, negatives, booleans, NaN,
    infinity, strings, lists and values too large for ``datetime.timedelta``
    raise ``ValueError`` naming the full key and the value received.
    """
    return _positive_minutes(cfg.get("distributed_timeout_minutes"), full_key(where, "distributed_timeout_minutes"))


def distributed_timeout_minutes_after_init(cfg: Mapping[str, Any], where: str = "policy") -> float | None:
    """The validated steady-state timeout, or None to keep the start-up value all run.

    It may not exceed ``distributed_timeout_minutes``: the start-up phase is the
    slow one, and a steady value above it would only delay hang detection. Set
    without a start-up value, it is compared against nothing (torch's default
    applies at start-up and is not known here per backend).
    """
    key = full_key(where, "distributed_timeout_minutes_after_init")
    steady = _positive_minutes(cfg.get("distributed_timeout_minutes_after_init"), key)
    startup = distributed_timeout_minutes(cfg, where)
    if steady is not None and startup is not None and steady > startup:
        startup_key = full_key(where, "distributed_timeout_minutes")
        raise ValueError(f"{key} must not exceed {startup_key} ({startup:g}), got {steady:g}")
    return steady


def patch_automodel(cfg: Mapping[str, Any], where: str = "policy") -> bool:
    """The validated ``patch_automodel`` flag (default True)."""
    value = cfg.get("patch_automodel", True)
    if not isinstance(value, bool):
        raise ValueError(f"{full_key(where, 'patch_automodel')} must be true or false, got {value!r}")
    return value


#: ``nemo_rl_shim.flight_recorder`` keys and their defaults.
FLIGHT_RECORDER_DEFAULTS: dict[str, Any] = {"enabled": False, "dump_dir": None, "buffer_size": 2000}


@dataclass(frozen=True)
class FlightRecorderSettings:
    """A validated, enabled ``flight_recorder`` block: where each rank writes its dump, how many entries it keeps."""

    dump_dir: Path
    buffer_size: int = FLIGHT_RECORDER_DEFAULTS["buffer_size"]


def _check_dir_name(value: Any, key: str) -> None:
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ValueError(f"{key} must name a directory (a non-empty string), got {value!r}")


def _writable_dir(value: Any, key: str) -> Path:
    """``value`` as a directory that exists (made if missing) and that this process can write to."""
    _check_dir_name(value, key)
    path = Path(value).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{key} must be a directory that exists or can be made, got {value!r}: {e}") from e
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ValueError(f"{key} must be a writable directory, got {value!r}: {e}") from e
    return path


def flight_recorder(cfg: Mapping[str, Any], where: str = "policy") -> FlightRecorderSettings | None:
    """The validated ``flight_recorder`` block, or None when it is unset, null or ``enabled: false``.

    Keys: ``enabled`` (bool, default false), ``dump_dir`` (a directory, required when enabled; made if
    missing and checked writable here, before any process group exists), ``buffer_size`` (entries
    per rank, a positive integer, default 2000). Unknown keys are rejected, naming the full key.
    """
    key = full_key(where, "flight_recorder")
    block = cfg.get("flight_recorder")
    if block is None:
        return None
    if not isinstance(block, Mapping):
        raise ValueError(f"{key} must be a mapping ({', '.join(FLIGHT_RECORDER_DEFAULTS)}), got {block!r}")
    unknown = sorted(set(block) - set(FLIGHT_RECORDER_DEFAULTS))
    if unknown:
        raise ValueError(
            f"{key}.{unknown[0]} is not a flight_recorder key (known: {', '.join(FLIGHT_RECORDER_DEFAULTS)}), "
            f"got {block[unknown[0]]!r}"
        )
    values = {**FLIGHT_RECORDER_DEFAULTS, **{k: v for k, v in block.items() if v is not None}}
    if not isinstance(values["enabled"], bool):
        raise ValueError(f"{key}.enabled must be true or false, got {values['enabled']!r}")
    size = plain_int(values["buffer_size"])
    if size is None or size < 1:
        raise ValueError(
            f"{key}.buffer_size must be a positive integer (entries per rank), got {shown(values['buffer_size'])}"
        )
    if values["dump_dir"] is not None:
        _check_dir_name(values["dump_dir"], f"{key}.dump_dir")
    if not values["enabled"]:
        return None
    if values["dump_dir"] is None:
        raise ValueError(f"{key}.dump_dir must name a directory when {key}.enabled is true, got None")
    return FlightRecorderSettings(_writable_dir(values["dump_dir"], f"{key}.dump_dir"), size)


#: ``nemo_rl_shim.learned_timeouts`` keys and their defaults. ``floor_minutes`` is a choice, not a measurement:
#: below a minute, host hiccups (a long garbage collection, a slow shared filesystem, a preempted CPU) that no
#: step time shows would start to kill healthy runs.
LEARNED_TIMEOUTS_DEFAULTS: dict[str, Any] = {"factor": 5.0, "min_steps": 8, "floor_minutes": 1.0}


@dataclass(frozen=True)
class LearnedTimeoutsSettings:
    """A validated ``learned_timeouts`` block, with the start-up value it may never exceed."""

    #: ``automodel_cfg.distributed_timeout_minutes``: the start-up value, and the most any learned value may be.
    ceiling_minutes: float
    #: The learned value is ``factor`` times the longest step (or phase) the ranks agreed on.
    factor: float = LEARNED_TIMEOUTS_DEFAULTS["factor"]
    #: Steps (the first one included) before the ranks first agree on the steady value, and between agreements.
    min_steps: int = LEARNED_TIMEOUTS_DEFAULTS["min_steps"]
    #: The lowest value ever set.
    floor_minutes: float = LEARNED_TIMEOUTS_DEFAULTS["floor_minutes"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return dict(self.__dict__)


def _factor(value: Any, key: str) -> float:
    rule = f"{key} must be a number greater than 1 (the learned timeout is factor x the longest step)"
    factor = plain_float(value)
    if factor is None:
        raise ValueError(f"{rule}, got {shown(value)} ({type(value).__name__})")
    if math.isnan(factor) or math.isinf(factor) or factor <= 1:
        raise ValueError(f"{rule}, got {shown(value)}")
    return factor


def _learned_block(cfg: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    block = cfg.get("learned_timeouts")
    if block is None:
        return None
    known = ", ".join(LEARNED_TIMEOUTS_DEFAULTS)
    if not isinstance(block, Mapping):
        raise ValueError(f"{key} must be a mapping ({known}) or null, got {block!r}")
    unknown = sorted(set(block) - set(LEARNED_TIMEOUTS_DEFAULTS), key=str)
    if unknown:
        raise ValueError(
            f"{key}.{unknown[0]} is not a learned_timeouts key (known: {known}), got {block[unknown[0]]!r}"
        )
    return block


def learned_timeouts(cfg: Mapping[str, Any], where: str = "policy") -> LearnedTimeoutsSettings | None:
    """The validated ``learned_timeouts`` block, or None when it is unset or null (off).

    Keys (a null value takes the default): ``factor`` (a number above 1, default 5), ``min_steps`` (a
    positive integer, default 8), ``floor_minutes`` (positive minutes, default 1, lowered to the ceiling
    when left unset and the ceiling is below it). ``{}`` is on with every default. On, it needs
    ``distributed_timeout_minutes`` (the ceiling) and refuses ``distributed_timeout_minutes_after_init``:
    both set the steady value, so the config must choose one. Unknown keys are refused, naming the full key.
    """
    key = full_key(where, "learned_timeouts")
    startup_key = full_key(where, "distributed_timeout_minutes")
    steady_key = full_key(where, "distributed_timeout_minutes_after_init")
    block = _learned_block(cfg, key)
    if block is None:
        return None
    ceiling = distributed_timeout_minutes(cfg, where)
    steady = distributed_timeout_minutes_after_init(cfg, where)
    if steady is not None:
        raise ValueError(
            f"{key} and {steady_key} ({steady:g}) both set the steady-state "
            f"timeout: choose one (remove distributed_timeout_minutes_after_init to learn it, or set "
            f"learned_timeouts: null to keep {steady:g} min), got learned_timeouts {dict(block)!r}"
        )
    if ceiling is None:
        raise ValueError(
            f"{key} needs {startup_key} (the start-up value, and the most a learned value may be), got None"
        )
    values = {**LEARNED_TIMEOUTS_DEFAULTS, **{k: v for k, v in block.items() if v is not None}}
    min_steps = plain_int(values["min_steps"])
    if min_steps is None or min_steps < 1:
        raise ValueError(
            f"{key}.min_steps must be a positive integer (steps before the first agreement), "
            f"got {shown(values['min_steps'])}"
        )
    floor = _positive_minutes(values["floor_minutes"], f"{key}.floor_minutes")
    assert floor is not None
    if block.get("floor_minutes") is None:
        floor = min(floor, ceiling)
    elif floor > ceiling:
        raise ValueError(f"{key}.floor_minutes must not exceed {startup_key} ({ceiling:g}), got {floor:g}")
    return LearnedTimeoutsSettings(ceiling, _factor(values["factor"], f"{key}.factor"), min_steps, floor)
