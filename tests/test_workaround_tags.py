"""Each workaround's removal steps name exactly the places that carry its tag, so they cannot go stale.

A repository-wide search (every file git tracks, and every untracked file it does not
ignore) for ``AUTOMODEL-WORKAROUND(<slug>)`` must find exactly the files the workaround's
``places`` lists, and the removal steps the tripwire prints must name each of them. The
parametrization covers every registered workaround, and every slug tagged in the tree is a
registered one, so no workaround can fall out of these checks.
"""

from __future__ import annotations

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


def test_the_checks_cover_every_registered_workaround() -> None:
    checked = [w.slug for w in CHECKED]
    registered = [w.slug for w in automodel_patch.WORKAROUNDS]
    assert checked == registered, f"the tag checks run on {checked}, the registry holds {registered}"


def test_every_tag_in_the_tree_is_a_checked_workaround() -> None:
    tagged = _tagged_slugs()
    checked = {w.slug for w in CHECKED}
    unchecked = {slug: sorted(files) for slug, files in tagged.items() if slug not in checked}
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
