"""One read of every number (#46): a config value made a plain ``int`` or ``float`` once, and checked on that value.

The rule (:mod:`nemo_rl_shim.config.numbers`) is tested kind by kind, with a ``float`` subclass whose ``__float__``
lies (0, then -5: torch once got 0 ms and -300,000 ms while validation saw 45) and an ``int`` subclass whose
``__index__`` and ``__int__`` lie, through the validators, ``parallel_sizes`` and ``setup_distributed`` itself on a
real one-rank Gloo world, whose default group's timeout is read back from torch. Text is read as ASCII digits only.
"""

from __future__ import annotations

import datetime
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
import torch.distributed as dist

from nemo_rl_shim import config as cfg
from nemo_rl_shim.cli.preflight.spawn import free_port
from nemo_rl_shim.config.integers import positive_int
from nemo_rl_shim.config.numbers import ascii_int, ascii_number, plain_float, plain_int
from nemo_rl_shim.process_groups.registry import backend_timeouts
from nemo_rl_shim.setup import distributed as distributed_module
from nemo_rl_shim.setup.distributed import RuntimeConfig, parallel_sizes, setup_distributed

np = pytest.importorskip("numpy", reason="numpy is not installed: the numpy rows of the table cannot be checked")

KEY = "distributed_timeout_minutes"


class LyingFloat(float):
    """A float holding 45 whose every other word lies."""

    said = 0.0

    def __float__(self) -> float:
        return self.said

    def __le__(self, other: object) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return False


class LyingInt(int):
    def __index__(self) -> int:
        return 0

    def __int__(self) -> int:
        return 0


class NegativeLiar(LyingFloat):
    said = -5.0


#: Each value, and what an int kind and a float kind read it as (None: refused).
TABLE: dict[str, tuple[Any, int | None, float | None]] = {
    "int": (45, 45, 45.0),
    "int subclass that lies": (LyingInt(2), 2, 2.0),
    "float": (45.5, None, 45.5),
    "float that says 0": (LyingFloat(45), None, 45.0),
    "float that says -5": (NegativeLiar(45), None, 45.0),
    "numpy int64": (np.int64(45), 45, 45.0),
    "numpy int32": (np.int32(2), 2, 2.0),
    "numpy float64": (np.float64(45), None, 45.0),
    "numpy float32": (np.float32(45), None, 45.0),
    "bool": (True, None, None),
    "numpy bool": (np.bool_(True), None, None),
    "Decimal": (Decimal("45"), None, None),
    "Fraction": (Fraction(45), None, None),
    "str": ("45", None, None),
    "None": (None, None, None),
    "int past a float": (10**400, 10**400, math.inf),
}


@pytest.mark.parametrize(("value", "as_int", "as_float"), list(TABLE.values()), ids=list(TABLE))
def test_each_kind_reads_a_value_once_as_the_table_says(value: Any, as_int: int | None, as_float: float | None) -> None:
    read_int, read_float = plain_int(value), plain_float(value)
    assert read_int == as_int and (read_int is None or type(read_int) is int)
    assert read_float == as_float and (read_float is None or type(read_float) is float)


def test_decimal_and_fraction_are_refused_alike_for_both_kinds_naming_the_type() -> None:
    for value in (Decimal("45"), Fraction(45)):
        with pytest.raises(
            ValueError, match=rf"must be a positive number of minutes, got .* \({type(value).__name__}\)"
        ):
            cfg.distributed_timeout_minutes({KEY: value})
        with pytest.raises(ValueError, match="must be a positive integer"):
            positive_int(value, "policy.dtensor_cfg.tensor_parallel_size")


@pytest.mark.parametrize("liar", [LyingFloat(45), NegativeLiar(45)], ids=["says-0", "says-minus-5"])
def test_a_lying_float_is_read_for_what_it_holds(liar: float) -> None:
    minutes = cfg.distributed_timeout_minutes({KEY: liar})
    assert type(minutes) is float and minutes == 45.0
    assert cfg.minutes_timedelta(liar, KEY) == datetime.timedelta(minutes=45)
    steady = cfg.distributed_timeout_minutes_after_init({KEY: 60, "distributed_timeout_minutes_after_init": liar})
    assert type(steady) is float and steady == 45.0


def test_a_lying_float_under_a_millisecond_is_refused_on_what_it_holds() -> None:
    """It says 45, it holds 1e-9: the check sees what it holds (and what torch would get)."""

    class SaysFortyFive(float):
        def __float__(self) -> float:
            return 45.0

    with pytest.raises(ValueError, match="whole milliseconds"):
        cfg.distributed_timeout_minutes({KEY: SaysFortyFive(1e-9)})


def test_sizes_are_read_once_as_plain_ints() -> None:
    sizes = parallel_sizes({"tensor_parallel_size": LyingInt(2), "context_parallel_size": np.int64(2)})
    assert (sizes.tp, sizes.cp) == (2, 2) and type(sizes.tp) is int and type(sizes.cp) is int
    for bad in (2.0, np.float64(2), True, Decimal(2), Fraction(2)):
        with pytest.raises(ValueError, match=r"policy.dtensor_cfg.tensor_parallel_size must be a positive integer"):
            parallel_sizes({"tensor_parallel_size": bad})


def test_the_learned_and_recorder_blocks_keep_the_plain_values(tmp_path) -> None:
    learned = cfg.learned_timeouts(
        {KEY: np.float32(45), "learned_timeouts": {"factor": LyingFloat(3), "min_steps": np.int64(4)}}
    )
    assert learned is not None
    assert (learned.ceiling_minutes, learned.factor, learned.min_steps) == (45.0, 3.0, 4)
    assert [type(v) for v in (learned.ceiling_minutes, learned.factor, learned.min_steps)] == [float, float, int]
    recorder = cfg.flight_recorder(
        {"flight_recorder": {"enabled": True, "dump_dir": str(tmp_path), "buffer_size": LyingInt(9)}}
    )
    assert recorder is not None and recorder.buffer_size == 9 and type(recorder.buffer_size) is int


class _AfterTheDefaultGroup(Exception):
    """Raised where setup_distributed goes on to build meshes: the default group exists, with its timeout."""


@pytest.mark.parametrize("liar", [LyingFloat(45), NegativeLiar(45)], ids=["says-0", "says-minus-5"])
def test_setup_distributed_gives_torch_the_value_it_checked(liar: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real one-rank Gloo world: the default group's timeout, read back from torch, is the 45 minutes checked (it
    was 0 ms, and -300,000 ms)."""
    assert not dist.is_initialized(), "a process group leaked into this test from an earlier one"
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    def stop(*args: Any, **kwargs: Any) -> None:
        raise _AfterTheDefaultGroup

    monkeypatch.setattr(distributed_module, "_fsdp2_config", stop)
    section = {"automodel_cfg": {KEY: liar}, "nemo_rl_shim": {"patch_automodel": False}, "dtensor_cfg": {}}
    try:
        with pytest.raises(_AfterTheDefaultGroup), pytest.warns(RuntimeWarning, match="patch_automodel is false"):
            setup_distributed(section, RuntimeConfig(cpu_offload=False))
        timeouts = backend_timeouts(dist.distributed_c10d._get_default_group())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert timeouts and set(timeouts.values()) == {datetime.timedelta(minutes=45)}, timeouts


@pytest.mark.parametrize(
    ("text", "whole", "number"),
    [
        ("45", 45, 45.0),
        ("0", 0, 0.0),
        ("0.5", None, 0.5),
        ("-5", None, -5.0),
        ("1e3", None, 1000.0),
        ("٤٥", None, None),  # Arabic-Indic digits: int() and float() read 45
        ("٨", None, None),
        ("²", None, None),  # "²".isdigit() is true, and int("²") fails
        ("4_5", None, None),
        (" 45", None, None),
        ("+8", None, 8.0),
        ("nan", None, None),
        ("inf", None, None),
        ("", None, None),
        ("9" * 41, None, None),
    ],
)
def test_text_is_read_as_ascii_digits_only(text: str, whole: int | None, number: float | None) -> None:
    assert ascii_int(text) == whole
    assert ascii_number(text) == number
