"""Each workaround's removal steps name exactly the places that carry its tag, so they cannot go stale.

A repository-wide search (every file git tracks, and every untracked file it does not
ignore) for ``AUTOMODEL-WORKAROUND(<slug>)`` must find exactly the files the workaround's
``places`` lists, and the removal steps the tripwire prints must name each of them. The
parametrization covers every registered workaround, the registry holds every workaround unit
found on disk, and every slug tagged in the tree is a registered one, so no workaround can fall
out of these checks.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import automodel_patch
from tests.harness.paths import REPO_ROOT

__all__: list[str] = []

GIT = shutil.which("git")
#: The workarounds the parametrized checks below run on: every registered one.
CHECKED = automodel_patch.WORKAROUNDS
_TAG = re.compile(r"AUTOMODEL-WORKAROUND\(([a-z0-9][a-z0-9-]*)\)")  # a real slug, not a "<slug>" placeholder


def _repository_files() -> list[Path]:
    if GIT is None or not (REPO_ROOT / ".git").exists():
        pytest.fail(f"the tag search needs git and a checkout; git={GIT}, {REPO_ROOT / '.git'} exists: "
                    f"{(REPO_ROOT / '.git').exists()}")  # fmt: skip
    listed = subprocess.run(
        [GIT, "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return [REPO_ROOT / name for name in listed.split("\0") if name and (REPO_ROOT / name).is_file()]


def _carrying(tag: str) -> set[str]:
    found = set()
    for path in _repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if tag in text:
            found.add(path.relative_to(REPO_ROOT).as_posix())
    return found


def _tagged_slugs() -> dict[str, set[str]]:
    """``{slug: files}`` for every ``AUTOMODEL-WORKAROUND(<slug>)`` tag found in the tree."""
    found: dict[str, set[str]] = {}
    for path in _repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for slug in _TAG.findall(text):
            found.setdefault(slug, set()).add(path.relative_to(REPO_ROOT).as_posix())
    return found


def _units_on_disk() -> dict[str, str]:
    """``{slug: file}`` for every module of ``automodel_patch`` whose source builds a ``WORKAROUND``."""
    units = {}
    for path in sorted((REPO_ROOT / "automodel_patch").glob("*.py")):
        if re.search(r"^WORKAROUND = Workaround\(", path.read_text(encoding="utf-8"), re.MULTILINE):
            module = importlib.import_module(f"automodel_patch.{path.stem}")
            units[module.WORKAROUND.slug] = path.name
    return units


def test_the_checks_cover_every_workaround_unit_on_disk() -> None:
    """The checks follow the registry; every unit file on disk must be in it, and nothing else."""
    on_disk = _units_on_disk()
    checked = sorted(w.slug for w in CHECKED)
    assert len(on_disk) >= 2, f"found {len(on_disk)} workaround units on disk: {on_disk}"  # the search works
    assert checked == sorted(on_disk), f"the tag checks run on {checked}, the unit files on disk are {on_disk}"


def test_the_removal_steps_name_the_shim_files_that_use_the_package() -> None:
    from automodel_patch._workaround import SHIM_USERS

    users = sorted(
        path.relative_to(REPO_ROOT).as_posix()
        for path in (REPO_ROOT / "nemo_rl_shim").rglob("*.py")
        if re.search(r"^\s*(import|from) automodel_patch\b", path.read_text(encoding="utf-8"), re.MULTILINE)
    )
    assert sorted(SHIM_USERS) == users
    steps = automodel_patch.WORKAROUNDS[0].removal_steps("9.9.9")
    assert all(user in steps for user in users), steps


def _nemo_rl_side_slugs() -> set[str]:
    """Slugs whose tagged code lives in NeMo RL's tree: tagged on an added line of an upstream patch.

    The NeMo RL series (``nemo_rl_shim/upstream``) marks its own temporary code with NeMo RL's
    ``AUTOMODEL-WORKAROUND(<slug>)`` convention; ``tests/upstream/test_nemo_rl_series.py`` checks
    that tag and its removal condition. Such a slug is not a workaround of this package.
    """
    slugs: set[str] = set()
    for patch in sorted((REPO_ROOT / "nemo_rl_shim" / "upstream").glob("*.patch")):
        for line in patch.read_text(encoding="utf-8").splitlines():
            if line.startswith("+") and not line.startswith("+++"):
                slugs.update(_TAG.findall(line))
    return slugs


def test_the_nemo_rl_series_tags_are_not_this_package_s() -> None:
    nemo_rl_side = _nemo_rl_side_slugs()
    assert nemo_rl_side, "no upstream patch adds an AUTOMODEL-WORKAROUND tag: the series lost its removal marker"
    clashing = nemo_rl_side & {w.slug for w in CHECKED}
    assert not clashing, f"NeMo RL-side tags that reuse a slug of this package's workarounds: {sorted(clashing)}"


def test_every_tag_in_the_tree_is_a_checked_workaround() -> None:
    tagged = _tagged_slugs()
    checked = {w.slug for w in CHECKED}
    nemo_rl_side = _nemo_rl_side_slugs()
    unchecked = {
        slug: sorted(files) for slug, files in tagged.items() if slug not in checked and slug not in nemo_rl_side
    }
    assert unchecked == {}, f"tags of workarounds the checks do not cover: {unchecked}; checked: {sorted(checked)}"
    assert checked <= set(tagged), (
        f"checked workarounds whose tag is nowhere in the tree: {sorted(checked - set(tagged))}"
    )


@pytest.mark.parametrize("workaround", CHECKED, ids=lambda w: w.slug)
def test_the_tag_is_in_exactly_the_listed_places(workaround) -> None:
    found = _carrying(workaround.tag)
    listed = set(workaround.places)
    assert found == listed, (
        f"{workaround.tag}: carried by files its places do not list: {sorted(found - listed)}; "
        f"listed but not carrying it: {sorted(listed - found)}"
    )


@pytest.mark.parametrize("workaround", CHECKED, ids=lambda w: w.slug)
def test_removal_steps_name_every_place_and_the_search(workaround) -> None:
    steps = workaround.removal_steps("9.9.9")
    for place in workaround.places:
        assert f" {place}: " in steps, f"the removal steps of {workaround.slug} do not name {place}"
    assert f'grep -rn "{workaround.tag}" .' in steps
    assert workaround.removal_condition in steps
