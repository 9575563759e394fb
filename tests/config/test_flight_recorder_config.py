"""``nemo_rl_shim.flight_recorder``: accepted and rejected values, and torch's variables it sets.

As in tests/config/test_config.py, each rejected value goes through the validator and through
``setup_distributed`` itself, which must fail before any process group exists (so in this
process, without ranks). :func:`nemo_rl_shim.flight_recorder.configure` is checked on a plain
dict standing in for the environment: which of torch's names it sets, and that it leaves a pair
alone when the user set either name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from nemo_rl_shim import RuntimeConfig, setup_distributed
from nemo_rl_shim.config import FLIGHT_RECORDER_DEFAULTS, FlightRecorderSettings, flight_recorder
from nemo_rl_shim.flight_recorder import DUMP_FILE_NAME, ENV_PAIRS, configure, dump_path

pytestmark = pytest.mark.every_lane

ROLES = ("policy", "value")
roles = pytest.mark.parametrize("role", ROLES)

#: Blocks that must be rejected, with the key the message must start with (after ``<role>.nemo_rl_shim.``).
BAD_BLOCKS: dict[str, tuple[Any, str]] = {
    "list": ([True], "flight_recorder must be a mapping"),
    "string": ("on", "flight_recorder must be a mapping"),
    "enabled-string": ({"enabled": "true", "dump_dir": "x"}, "flight_recorder.enabled must be true or false"),
    "enabled-one": ({"enabled": 1, "dump_dir": "x"}, "flight_recorder.enabled must be true or false"),
    "size-zero": ({"enabled": True, "dump_dir": "x", "buffer_size": 0}, "flight_recorder.buffer_size must be"),
    "size-negative": ({"buffer_size": -5}, "flight_recorder.buffer_size must be"),
    "size-float": ({"enabled": True, "dump_dir": "x", "buffer_size": 2.5}, "flight_recorder.buffer_size must be"),
    "size-bool": ({"buffer_size": True}, "flight_recorder.buffer_size must be"),
    "size-string": ({"buffer_size": "2000"}, "flight_recorder.buffer_size must be"),
    "dir-missing": ({"enabled": True}, "flight_recorder.dump_dir must name a directory when"),
    "dir-empty": ({"enabled": True, "dump_dir": ""}, "flight_recorder.dump_dir must name a directory"),
    "dir-number": ({"enabled": False, "dump_dir": 7}, "flight_recorder.dump_dir must name a directory"),
    "unknown-key": ({"enabled": True, "dump_dir": "x", "dir": "y"}, "flight_recorder.dir is not a flight_recorder key"),
}


def _section(block: Any) -> dict[str, Any]:
    return {"nemo_rl_shim": {"flight_recorder": block}, "dtensor_cfg": {}}


@pytest.fixture
def no_process_group():
    assert not dist.is_initialized(), "a process group leaked into this test from an earlier one"
    yield
    assert not dist.is_initialized(), "the test left a process group behind"


@pytest.fixture(autouse=True)
def recorder_state_restored():
    """configure() switches the recorder on for this process; later tests in this worker must find it off."""
    from nemo_rl_shim.flight_recorder import recorder as module

    saved = module._State.settings
    yield
    module._State.settings = saved


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Relative ``dump_dir`` values ("x") resolve under a fresh directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# --- accepted values ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [None, {}, {"enabled": False}, {"enabled": False, "dump_dir": "x"}])
def test_unset_null_or_disabled_is_off_and_makes_nothing(block: Any, in_tmp: Path) -> None:
    assert flight_recorder({"flight_recorder": block}) is None
    assert flight_recorder({}) is None
    assert not (in_tmp / "x").exists(), "a disabled recorder must not create its directory"


def test_defaults_are_off_with_2000_entries() -> None:
    assert FLIGHT_RECORDER_DEFAULTS == {"enabled": False, "dump_dir": None, "buffer_size": 2000}


def test_enabled_makes_the_directory_and_keeps_the_size(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    settings = flight_recorder({"flight_recorder": {"enabled": True, "dump_dir": str(target), "buffer_size": 64}})
    assert settings == FlightRecorderSettings(target, 64)
    assert target.is_dir()
    default = flight_recorder({"flight_recorder": {"enabled": True, "dump_dir": str(target)}})
    assert default is not None and default.buffer_size == 2000


# --- rejected values ----------------------------------------------------------------------------------------------


@roles
@pytest.mark.parametrize("case", list(BAD_BLOCKS), ids=list(BAD_BLOCKS))
def test_bad_block_names_full_key_and_value(role: str, case: str, in_tmp: Path) -> None:
    block, start = BAD_BLOCKS[case]
    with pytest.raises(ValueError) as raised:
        flight_recorder({"flight_recorder": block}, role)
    message = str(raised.value)
    assert message.startswith(f"{role}.nemo_rl_shim.{start}"), message
    assert "got " in message, message


@roles
@pytest.mark.parametrize("case", list(BAD_BLOCKS), ids=list(BAD_BLOCKS))
def test_setup_distributed_rejects_a_bad_block_before_any_group(
    role: str, case: str, in_tmp: Path, no_process_group
) -> None:
    block, start = BAD_BLOCKS[case]
    with pytest.raises(ValueError, match=rf"^{role}\.nemo_rl_shim\.{start.split(' ')[0]}"):
        setup_distributed(_section(block), RuntimeConfig(), role=role)
    assert not dist.is_initialized()


def test_a_file_where_the_directory_should_be_is_rejected(tmp_path: Path, no_process_group) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    value = str(blocker / "dumps")
    with pytest.raises(ValueError) as raised:
        setup_distributed(_section({"enabled": True, "dump_dir": value}), RuntimeConfig())
    message = str(raised.value)
    assert message.startswith("policy.nemo_rl_shim.flight_recorder.dump_dir must be a directory that exists or can be")
    assert repr(value) in message


def test_a_read_only_directory_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write probe fails as on a read-only mount (made to: the tests may run as root, who writes anywhere)."""
    import tempfile

    def read_only(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    with pytest.raises(ValueError, match=r"dump_dir must be a writable directory, got .*Read-only file system"):
        flight_recorder({"flight_recorder": {"enabled": True, "dump_dir": str(tmp_path)}})


# --- torch's variables --------------------------------------------------------------------------------------------


def test_configure_sets_torchs_newest_names(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    applied = configure(FlightRecorderSettings(tmp_path, 123), env)
    assert (
        env
        == applied
        == {
            "TORCH_FR_BUFFER_SIZE": "123",
            "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / DUMP_FILE_NAME),
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        }
    )
    assert dump_path(3, env) == tmp_path / f"{DUMP_FILE_NAME}3"


@pytest.mark.parametrize("pair", list(ENV_PAIRS), ids=list(ENV_PAIRS))
@pytest.mark.parametrize("which", [0, 1], ids=["newest-name", "older-name"])
def test_configure_never_overrides_a_variable_the_user_set(tmp_path: Path, pair: str, which: int) -> None:
    name = ENV_PAIRS[pair][which]
    env = {name: "users-value"}
    applied = configure(FlightRecorderSettings(tmp_path, 50), env)
    assert env[name] == "users-value"
    if name == "TORCH_FR_DUMP_ON_TIMEOUT":  # copied to the one name stock NCCL reads (torch 2.15's hook reads both)
        assert applied.pop("TORCH_NCCL_DUMP_ON_TIMEOUT") == "users-value"
    assert not set(ENV_PAIRS[pair]) & set(applied), f"set {applied} although the user set {name}"
    assert len(applied) == len(ENV_PAIRS) - 1


def test_dump_path_follows_the_users_prefix() -> None:
    assert dump_path(2, {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/data/trace_"}) == Path("/data/trace_2")
    assert dump_path(0, {}) == Path("/tmp/nccl_trace_rank_0"), "torch's own default"
