"""The audit of every process group torch holds (:mod:`nemo_rl_shim.audit`): where each timeout came from, the one
log line, and the JSON it crosses a process as.

One Gloo rank in this process (``init_process_group`` on a ``HashStore``), torch's ``fake`` backend for a world
of 8, and a two-half group whose CUDA half is a Gloo object (NCCL is what this machine lacks). The audit as 4
real ranks see it through every phase is in tests/process_groups/test_later.py.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from nemo_rl_shim.audit import BackendTimeout, GroupAudit, GroupsAudit, TimeoutSource, audit_groups, log_groups
from nemo_rl_shim.process_groups import later, setting
from nemo_rl_shim.setup.distributed import DistributedContext
from tests.harness.one_rank import by_name, one_rank_world, readings

pytestmark = [pytest.mark.every_lane]

STARTUP_S, STEADY_MIN, OWN_S = 12.0, 0.05, 7.0
GLOO_DEFAULT_S = 30 * 60.0
S = datetime.timedelta


@pytest.fixture
def world() -> Iterator[DistributedContext]:
    """A one-rank Gloo world at the 12 s start-up value; torn down (and torch's function back) after."""
    with one_rank_world(S(seconds=STARTUP_S), STEADY_MIN) as context:
        yield context


def test_the_audit_says_where_each_timeout_came_from(world) -> None:
    later.follow(S(seconds=STARTUP_S), {"default": dist.group.WORLD})
    untouched = dist.new_group()
    setting.set_group_timeout(S(seconds=GLOO_DEFAULT_S), untouched)  # back at torch's default
    own = dist.new_group(timeout=S(seconds=OWN_S))
    audit = audit_groups(world)
    groups = by_name(audit)
    assert (audit.rank, audit.world_size, audit.configured_s) == (0, 1, STARTUP_S)
    assert groups["0"].axes == ("default",) and groups["0"].group_desc == "default_pg"
    assert groups["0"].backend == "gloo" and groups["0"].ranks == (0,)
    assert readings(groups["0"]) == {d: (STARTUP_S, TimeoutSource.CONFIGURED) for d in ("cpu", "cuda")}
    assert readings(groups[untouched.group_name]) == {
        d: (GLOO_DEFAULT_S, TimeoutSource.TORCH_DEFAULT) for d in ("cpu", "cuda")
    }
    assert readings(groups[own.group_name]) == {d: (OWN_S, TimeoutSource.OWN) for d in ("cpu", "cuda")}
    assert [g.group_name for g in audit.at_torch_default] == [untouched.group_name]
    assert GroupsAudit.from_json(audit.to_json()) == audit


def test_the_audit_against_a_configured_value_given_by_the_caller(world) -> None:
    """No following (NeMo RL's own set-up): the caller names the configured value."""
    audit = audit_groups(configured=S(seconds=STARTUP_S))
    assert readings(audit.groups[0]) == {d: (STARTUP_S, TimeoutSource.CONFIGURED) for d in ("cpu", "cuda")}
    assert audit_groups().groups[0].sources == {TimeoutSource.OWN}  # nothing configured: 12 s is its own


def test_the_log_line_names_every_group_off_the_configured_value(world, caplog) -> None:
    later.follow(S(seconds=STARTUP_S), {"default": dist.group.WORLD})
    own = dist.new_group(timeout=S(seconds=OWN_S))
    with caplog.at_level(logging.INFO, logger="nemo_rl_shim.audit"):
        audit = log_groups(world)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "nemo_rl_shim.audit"]
    assert line == audit.line()
    assert line == f"process groups on rank 0 of 1: 2; configured 12 s on 1; own: undefined:{own.group_name} [0] 7 s"


def test_the_audit_reads_fake_groups_as_unreadable() -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=3, world_size=8)
    try:
        dist.new_group([2, 3])
        audit = audit_groups()
    finally:
        dist.destroy_process_group()
    assert (audit.rank, audit.world_size, len(audit.groups)) == (3, 8, 2)
    assert audit.groups[1].ranks == (2, 3)
    assert {(b.backend, b.timeout_s, b.source) for g in audit.groups for b in g.backends} == {
        ("fake", None, TimeoutSource.UNREADABLE)
    }
    assert "unreadable: default_pg:0 [0-7] ?" in audit.line()


def test_an_audit_with_no_world_is_empty() -> None:
    assert audit_groups() == GroupsAudit(rank=None, world_size=None, configured_s=None, groups=())


_GOOD = GroupsAudit(
    rank=1,
    world_size=2,
    configured_s=12.0,
    groups=(
        GroupAudit("0", "default_pg", (0, 1), "gloo", (BackendTimeout("cpu", "gloo", 12.0, TimeoutSource.CONFIGURED),)),
    ),
)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("groups"), r"audit\.groups is missing"),
        (lambda d: d.update(rank="1"), r"audit\.rank must be an integer or null, got '1'"),
        (lambda d: d["groups"][0].update(ranks=[0, True]), r"audit\.groups\[0\]\.ranks must be a list of integers"),
        (
            lambda d: d["groups"][0]["backends"][0].update(source="guessed"),
            r"audit\.groups\[0\]\.backends\[0\]\.source must be one of configured, own, torch_default, unreadable",
        ),
        (lambda d: d["groups"][0]["backends"][0].pop("timeout_s"), r"backends\[0\]\.timeout_s is missing"),
    ],
)
def test_from_json_refuses_what_to_json_does_not_write(change, message) -> None:
    data = json.loads(_GOOD.to_json())
    assert GroupsAudit.from_json(json.dumps(data)) == _GOOD
    change(data)
    with pytest.raises(ValueError, match=message):
        GroupsAudit.from_json(json.dumps(data))


def test_from_json_refuses_text_that_is_not_json() -> None:
    with pytest.raises(ValueError, match="a groups audit must be JSON"):
        GroupsAudit.from_json("{rank")


def test_the_cuda_half_is_read_where_a_group_has_two() -> None:
    """A two-half group ("cuda:nccl,cpu:gloo"; the CUDA half a Gloo object, NCCL being what this machine lacks)."""
    from automodel_patch._simulated_group import simulated_default_group

    with simulated_default_group("cuda:nccl,cpu:gloo") as group:
        group._get_backend(torch.device("cuda"))._set_default_timeout(S(seconds=OWN_S))
        audit = audit_groups(configured=S(minutes=1))
    (probe,) = audit.groups
    assert probe.backend == "cuda:nccl,cpu:gloo"
    assert readings(probe) == {"cpu": (60.0, TimeoutSource.CONFIGURED), "cuda": (OWN_S, TimeoutSource.OWN)}


def test_the_line_counts_a_group_as_configured_only_when_every_half_is() -> None:
    """A two-half group whose CUDA half is at torch's default: not "configured", and the line names that half; a
    minute reads "1 min"."""
    cpu_only = GroupAudit(
        "0",
        "default_pg",
        (0, 1),
        "cuda:nccl,cpu:gloo",
        (
            BackendTimeout("cpu", "gloo", 60.0, TimeoutSource.CONFIGURED),
            BackendTimeout("cuda", "nccl", 600.0, TimeoutSource.TORCH_DEFAULT),
        ),
        axes=("default",),
    )
    both = GroupAudit("1", "mesh_tp", (0, 1), "gloo", (BackendTimeout("cpu", "gloo", 60.0, TimeoutSource.CONFIGURED),))
    audit = GroupsAudit(rank=0, world_size=2, configured_s=60.0, groups=(cpu_only, both))
    assert audit.line() == (
        "process groups on rank 0 of 2: 2; configured 1 min on 1; "
        "at torch's default: default (default_pg:0) [0-1] 10 min (cuda)"
    )


def test_a_group_that_two_mesh_axes_name_is_audited_under_both(world) -> None:
    """A one-rank world: the mesh's only axis spans the world, so torch gives it the default group itself."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    context = world._replace(device_mesh=mesh)
    assert mesh.get_group("tp") is dist.group.WORLD
    (default,) = [g for g in audit_groups(context).groups if g.group_desc == "default_pg"]
    assert default.axes == ("default", "tp")
    assert default.label == "default/tp (default_pg:0)"


def test_from_json_refuses_a_boolean_rank() -> None:
    data = json.loads(_GOOD.to_json())
    data["rank"] = True
    with pytest.raises(ValueError, match=r"audit\.rank must be an integer or null, got True"):
        GroupsAudit.from_json(json.dumps(data))
