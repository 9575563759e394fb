"""Rank function for tests/flight_recorder/test_later_groups.py: groups made after ``setup_distributed``, a rank that
never uses one, and what every rank's dump and group map say of them. Real Gloo ranks, the recorder on.

Four ranks, tp=2, through the real ``setup_distributed``. After set-up every rank makes ``later`` (``new_group`` of
ranks 1-3) and tries one ``split_group`` (``[0, 3]`` and ``[1, 2]``; torch refuses it on CPU where the default group
has no bound device, and the refusal is returned). Each rank reads its group map file (the sidecar) at set-up, after
making the groups, and inside a watched block. Then ``after_first_step`` (every group to the steady 3 s), ``late``
(``new_group`` of ranks 0 and 3), and the incident: ranks 1 and 2 all_reduce on ``later`` and time out, rank 3 never
enters it and waits for its dump (its watcher's, asked through the store), as does rank 0, which is not in ``later``.
Neither rank 0 nor rank 3 enters a watched block after ``late`` is made: only a dump can have put ``late`` in their
group map files.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
import torch.distributed as dist

from nemo_rl_shim import flight_recorder
from nemo_rl_shim.config import blocks
from nemo_rl_shim.setup.distributed import RuntimeConfig, setup_distributed
from nemo_rl_shim.timeouts import after_first_step
from tests.ranks.meet import rank_0_leaves_last

__all__ = ["LATE", "LATER", "SPLIT", "run"]

LATER = [1, 2, 3]
LATE = [0, 3]
SPLIT = [[0, 3], [1, 2]]
_DUMP_WAIT_S = 40
_STORE_WAIT_S = 60


def _section(params: dict[str, Any]) -> dict[str, Any]:
    knobs = {
        "distributed_timeout_minutes": params["startup"],
        "distributed_timeout_minutes_after_init": params["steady"],
        "flight_recorder": {"enabled": True, "dump_dir": params["dump_dir"], "buffer_size": 200},
    }
    return {**blocks(knobs), "dtensor_cfg": {"tensor_parallel_size": 2}}


def _sidecar_groups() -> dict[str, list[int]]:
    """This rank's group map file as it stands: ``{group name: ranks}``."""
    rank = dist.get_rank()
    path = flight_recorder.dump_path(rank).parent / flight_recorder.SIDECAR_NAME.format(rank=rank)
    return {name: facts["ranks"] for name, facts in json.loads(path.read_text())["groups"].items()}


def _named(group: Any) -> dict[str, Any] | None:
    """A group this rank is in, by its name and ranks; None where the rank is not in it."""
    if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
        return None
    return {"name": str(group.group_name), "ranks": dist.get_process_group_ranks(group)}


def _split() -> dict[str, Any]:
    split = getattr(dist, "split_group", None)
    if split is None:
        return {"error": "this torch has no torch.distributed.split_group"}
    try:
        return {"group": _named(split(split_ranks=SPLIT))}
    except Exception as error:  # torch 2.11 on CPU: "No device associated with the default pg"
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]}


def _wait_for_own_dump() -> bool:
    path = flight_recorder.dump_path(dist.get_rank())
    end = time.monotonic() + _DUMP_WAIT_S
    while time.monotonic() < end:
        if path.exists():
            return True
        time.sleep(0.1)
    return False


def run(params: dict[str, Any]) -> dict[str, Any]:
    """Set up, make the later groups, read the group map file at each step, run the incident; return the facts."""
    context = setup_distributed(_section(params), RuntimeConfig())
    rank = dist.get_rank()
    out: dict[str, Any] = {"rank": rank, "torch": torch.__version__, "at_set_up": _sidecar_groups()}
    later = dist.new_group(LATER)
    out["later"] = _named(later)
    out["split"] = _split()
    out["after_making"] = _sidecar_groups()
    with flight_recorder.stack_watch("reading the group map"):
        out["in_a_block"] = _sidecar_groups()
    after_first_step(context)
    out["late"] = _named(dist.new_group(LATE))
    if rank in (1, 2):
        start = time.monotonic()
        try:
            with flight_recorder.dump_on_timeout("all_reduce on the later group"):
                dist.all_reduce(torch.ones(2), group=later)
            out["outcome"] = "completed"
        except RuntimeError as error:
            out["outcome"], out["error"] = "raised", str(error)[:300]
        out["seconds"] = time.monotonic() - start
    else:
        out["outcome"] = "stayed out"
    out["dumped"] = _wait_for_own_dump()
    out["at_the_end"] = _sidecar_groups()
    rank_0_leaves_last("done/later_groups", _STORE_WAIT_S)
    return out
