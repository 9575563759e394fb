"""Both workarounds against every release 0.3.0 ... 0.7.0, the fixed-0.7.0 fixture wheels, and source-patched copies.

# AUTOMODEL-WORKAROUND(keep-cpu-backend): the keep-cpu-backend column of EXPECTED.
# AUTOMODEL-WORKAROUND(cpu-mesh-timeout): the cpu-mesh-timeout column of EXPECTED.

Each release's real sources shadow the installed one on ``PYTHONPATH`` in a spawned
process (:mod:`tests.harness.release_facts`); the worker reports what detection says of each
workaround, what ``apply()`` does (twice), what is installed after, and what ``revert()``
restores, one workaround at a time and all together.

The fixture releases are the real 0.7.0 with ``_nccl_backend_override`` fixed four ways
(:mod:`tests.harness.fixture_wheels`): the rehearsal of the pin bump. There keep-cpu-backend is
not needed and is not applied, while cpu-mesh-timeout still is (the fix keeps its
``device_type != "cuda"`` guard). ``cudaquery`` is fixed too, but asks for a CUDA device
while probed, so on this machine detection cannot judge it: "unknown", and ``apply()``
puts the layer in (it is correct whatever the genuine code does).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from automodel_patch import ApplyStatus
from tests.harness.fixture_wheels import JUDGEABLE_STYLES, fixture_version
from tests.harness.release_facts import SOURCE_PATCH_SUFFIX
from tests.harness.releases import ALL_RELEASES, FIXED_FUNCTION_RELEASES, LEGACY_RELEASES

__all__: list[str] = []

pytestmark = pytest.mark.releases

KEEP, CPU_MESH = "keep-cpu-backend", "cpu-mesh-timeout"
OVERRIDE, REUSE, UNFLATTEN = "_nccl_backend_override", "init_device_mesh", "_unflatten_compat"
FIXTURES = tuple(fixture_version(style) for style in JUDGEABLE_STYLES)
UNKNOWN_FIXTURE = fixture_version("cudaquery")
SOURCE_PATCHED = tuple(f"{v}{SOURCE_PATCH_SUFFIX}" for v in FIXED_FUNCTION_RELEASES)

#: release -> ({workaround: genuine verdict}, names apply() replaces)
EXPECTED: dict[str, tuple[dict[str, str], set[str]]] = {
    **{v: ({KEEP: "absent", CPU_MESH: "absent"}, set()) for v in LEGACY_RELEASES},
    # 0.5.0's _unflatten_compat takes no timeout_minutes: no MoE plumbing to wrap.
    "0.5.0": ({KEEP: "needed", CPU_MESH: "needed"}, {OVERRIDE, REUSE}),
    "0.6.0": ({KEEP: "needed", CPU_MESH: "needed"}, {OVERRIDE, REUSE, UNFLATTEN}),
    "0.7.0": ({KEEP: "needed", CPU_MESH: "needed"}, {OVERRIDE, REUSE, UNFLATTEN}),
    **{f: ({KEEP: "not_needed", CPU_MESH: "needed"}, {OVERRIDE, REUSE, UNFLATTEN}) for f in FIXTURES},
    UNKNOWN_FIXTURE: ({KEEP: "unknown", CPU_MESH: "needed"}, {OVERRIDE, REUSE, UNFLATTEN}),
    "0.5.0" + SOURCE_PATCH_SUFFIX: ({KEEP: "not_needed", CPU_MESH: "needed"}, {OVERRIDE, REUSE}),
    **{
        f"{v}{SOURCE_PATCH_SUFFIX}": ({KEEP: "not_needed", CPU_MESH: "needed"}, {OVERRIDE, REUSE, UNFLATTEN})
        for v in ("0.6.0", "0.7.0")
    },
}
#: What apply() reports for each genuine verdict.
APPLY_FOR = {
    "absent": ApplyStatus.UNSUPPORTED.value,
    "needed": ApplyStatus.APPLIED.value,
    "unknown": ApplyStatus.APPLIED.value,
    "not_needed": ApplyStatus.NOT_NEEDED.value,
}
EVERY = (*ALL_RELEASES, *FIXTURES, UNKNOWN_FIXTURE, *SOURCE_PATCHED)


def _verdicts(detections: dict[str, dict[str, str]]) -> dict[str, str]:
    return {slug: d["verdict"] for slug, d in detections.items()}


@pytest.mark.parametrize("name", EVERY)
def test_the_worker_imported_that_release(name: str, release_facts) -> None:
    facts = release_facts(name)
    assert Path(facts["mesh_utils_file"]).is_relative_to(facts["root"]), (facts["mesh_utils_file"], facts["root"])
    assert facts["installed_version"] == name.removesuffix(SOURCE_PATCH_SUFFIX)


@pytest.mark.parametrize("name", EVERY)
def test_detection_verdicts(name: str, release_facts) -> None:
    facts = release_facts(name)
    expected, _ = EXPECTED[name]
    assert _verdicts(facts["genuine"]) == expected, facts["genuine"]
    assert facts["active_before"] == []


@pytest.mark.parametrize("name", EVERY)
def test_apply_puts_in_exactly_what_is_still_needed(name: str, release_facts) -> None:
    facts = release_facts(name)
    expected, names = EXPECTED[name]
    assert facts["apply"] == {slug: APPLY_FOR[verdict] for slug, verdict in expected.items()}
    needed = [slug for slug, verdict in expected.items() if verdict in ("needed", "unknown")]
    assert facts["apply_again"] == {
        slug: ApplyStatus.ALREADY_APPLIED.value if slug in needed else APPLY_FOR[verdict]
        for slug, verdict in expected.items()
    }
    assert facts["active_after"] == needed
    assert set(facts["patched_names"]) == names
    # Each replaced name says which workarounds it carries; only the override is layered by both.
    for name_, slugs in facts["marker_of"].items():
        assert set(slugs) <= set(needed) and slugs, (name_, slugs)
    if needed:
        assert set(facts["marker_of"][OVERRIDE]) == set(needed)
    # The genuine verdicts ignore the installed layers; the installed code behaves where a layer went in.
    assert _verdicts(facts["genuine_after"]) == expected
    for slug in needed:
        assert facts["installed_after"][slug]["verdict"] == "not_needed", facts["installed_after"][slug]


@pytest.mark.parametrize("name", [n for n in EVERY if len(EXPECTED[n][1]) and EXPECTED[n][0][KEEP] != "not_needed"])
def test_reverting_one_workaround_leaves_the_other_in_force(name: str, release_facts) -> None:
    facts = release_facts(name)
    one = facts["revert_one"]
    assert one == {
        "slug": KEEP,
        "changed": True,
        "active": [CPU_MESH],
        "installed": {
            KEEP: {**facts["genuine"][KEEP]},
            CPU_MESH: {**facts["installed_after"][CPU_MESH]},
        },
    }


@pytest.mark.parametrize("name", EVERY)
def test_revert_restores_the_module(name: str, release_facts) -> None:
    facts = release_facts(name)
    _, names = EXPECTED[name]
    assert facts["module_unchanged_after_apply"] is (not names)
    assert facts["revert"] is bool(names)
    assert facts["revert_again"] is False
    assert facts["module_restored_after_revert"] is True
    assert facts["installed_after_revert"] == facts["genuine"]


@pytest.mark.parametrize("name", LEGACY_RELEASES)
def test_legacy_release_warns_once_and_changes_nothing(name: str, release_facts) -> None:
    facts = release_facts(name)
    assert facts["build_accepts_timeout"] is False
    messages = [w["message"] for w in facts["warnings"]]
    assert len(messages) == 1, f"expected one warning for two apply() calls, got {messages}"
    assert facts["warnings"][0]["category"] == "RuntimeWarning"
    assert f"nemo-automodel {name}" in messages[0] and "nothing was changed" in messages[0], messages[0]
    assert f"{KEEP}, {CPU_MESH}" in messages[0], messages[0]


@pytest.mark.parametrize("name", [n for n in EVERY if n not in LEGACY_RELEASES])
def test_no_warning_where_something_can_be_applied(name: str, release_facts) -> None:
    assert release_facts(name)["warnings"] == []


def test_unknown_says_why(release_facts) -> None:
    keep = release_facts(UNKNOWN_FIXTURE)["genuine"][KEEP]
    assert keep["verdict"] == "unknown"
    assert "raised RuntimeError" in keep["reason"], keep["reason"]


def test_facts_of_a_release_imported_late_equal_those_of_a_fresh_process(release_facts) -> None:
    """The suite computes every release's facts in one process, importing them in turn: nothing of an
    earlier release may leak into a later one's verdicts, decisions or apply/revert."""
    name = fixture_version("getbackendconfig")  # imported after the five releases and two other fixtures
    shared, fresh = release_facts(name), release_facts(name, fresh_process=True)
    assert shared == fresh
