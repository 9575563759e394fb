"""Which files of a folder are one run's (:mod:`nemo_rl_shim.hang_report.folder`): each rule on empty files named
for it (nothing here opens them).

The report over such folders: tests/hang_report/test_hang_report_reading.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_rl_shim.hang_report.folder import RANK_DIGITS, dump_prefixes, find_run, is_rank_text, stack_files, walk
from nemo_rl_shim.hang_report.records import DumpError

pytestmark = [pytest.mark.every_lane]

NO_ENV: dict[str, str] = {}


def _files(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")
    return root


def test_a_path_that_is_not_a_folder_is_refused(tmp_path: Path) -> None:
    dump = _files(tmp_path, "nccl_trace_rank_0") / "nccl_trace_rank_0"
    with pytest.raises(DumpError, match=r"nccl_trace_rank_0 is not a directory$"):
        find_run(dump, NO_ENV)
    with pytest.raises(DumpError, match="gone is not a directory"):
        find_run(tmp_path / "gone", NO_ENV)


def test_a_rank_of_18_digits_is_read_and_one_of_19_is_refused(tmp_path: Path) -> None:
    assert RANK_DIGITS == 18
    ok = find_run(_files(tmp_path / "a", "nccl_trace_rank_" + "9" * 18), NO_ENV)
    assert list(ok.dumps) == [10**18 - 1]
    with pytest.raises(DumpError, match=r"_1{19} end in a number that is not a rank's name"):
        find_run(_files(tmp_path / "b", "nccl_trace_rank_" + "1" * 19), NO_ENV)  # a stray, and nothing else


def test_a_runs_dumps_group_maps_and_stacks_are_found_by_their_names(tmp_path: Path) -> None:
    root = _files(tmp_path, "nccl_trace_rank_0", "nccl_trace_rank_1", "fr_groups_rank_0.json", "fr_stack_rank_1.txt",
                  "notes.txt", ".hidden_rank_3", ".cache/nccl_trace_rank_9")  # fmt: skip
    run = find_run(root, NO_ENV)
    assert (run.prefix, sorted(run.dumps), sorted(run.sidecars), sorted(run.stacks)) == ("nccl_trace_rank_", [0, 1],
                                                                                          [0], [1])  # fmt: skip
    assert run.dumps[1] == root / "nccl_trace_rank_1" and run.rule == "" and run.left == {}
    assert run.root == root.resolve() and run.directory == root


def test_every_file_is_walked_hidden_ones_skipped_in_order(tmp_path: Path) -> None:
    root = _files(tmp_path, "b/x1", "a/x2", "x0", ".h/x3", "a/.x4")
    assert [p.relative_to(root).as_posix() for p in walk(root)] == ["x0", "a/x2", "b/x1"]


def test_a_rank_with_two_files_of_one_kind_is_refused(tmp_path: Path) -> None:
    twice = _files(tmp_path / "d", "n1/nccl_trace_rank_0", "n2/nccl_trace_rank_0")
    with pytest.raises(DumpError, match=r"^rank 0 has two dumps, .*n1/nccl_trace_rank_0 and .*n2/nccl_trace_rank_0"):
        find_run(twice, NO_ENV)
    maps = _files(tmp_path / "m", "n1/nccl_trace_rank_0", "n1/fr_groups_rank_0.json", "n2/fr_groups_rank_0.json")
    with pytest.raises(DumpError, match="rank 0 has two group maps"):
        find_run(maps, NO_ENV)
    stacks = [tmp_path / "s1" / "fr_stack_rank_2.txt", tmp_path / "s2" / "fr_stack_rank_2.txt"]
    with pytest.raises(DumpError, match="rank 2 has two stack files"):
        stack_files(stacks)
    assert stack_files([tmp_path / "fr_stack_rank_2.txt", tmp_path / "fr_stack_rank_x.txt"]) == {
        2: tmp_path / "fr_stack_rank_2.txt"
    }  # fmt: skip


@pytest.mark.parametrize("other", ["sub/fr_groups_rank_1.json", "sub/fr_stack_rank_1.txt", "sub/nccl_trace_rank_1"])
def test_a_runs_files_lie_at_one_depth_group_maps_and_stacks_included(tmp_path: Path, other: str) -> None:
    root = _files(tmp_path, "nccl_trace_rank_0", other)
    with pytest.raises(DumpError, match=r"holds one run's files at several depths \(.*nccl_trace_rank_0 and .*sub/"):
        find_run(root, NO_ENV)
    per_node = _files(tmp_path / "nodes", "n0/nccl_trace_rank_0", "n1/nccl_trace_rank_1", "n1/fr_stack_rank_1.txt")
    assert sorted(find_run(per_node, NO_ENV).dumps) == [0, 1]


def test_a_folder_without_dumps_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        DumpError, match=r"holds no flight-recorder dumps \(files named <prefix><rank>, the rank in ASCII digits\)$"
    ):
        find_run(_files(tmp_path, "fr_groups_rank_0.json", "readme"), NO_ENV)


def test_dumps_of_several_prefixes_are_refused_naming_each_and_where(tmp_path: Path) -> None:
    root = _files(tmp_path, "a/nccl_trace_rank_0", "b/nccl_trace_rank_1", "c/nccl_trace_rank_2",
                  "d/nccl_trace_rank_3", "a/old_0")  # fmt: skip
    with pytest.raises(DumpError) as refused:
        find_run(root, NO_ENV)
    assert str(refused.value).endswith(
        "holds dumps of several runs: nccl_trace_rank_<rank> (4 in a, b, c and 1 more folders); old_<rank> (1 in a); "
        "keep one run per folder, or name the run's prefix in TORCH_FR_DUMP_TEMP_FILE"
    )


def test_three_folders_are_named_and_a_fourth_is_counted(tmp_path: Path) -> None:
    three = _files(tmp_path / "t", "a/nccl_trace_rank_0", "b/nccl_trace_rank_1", "c/nccl_trace_rank_2", "old_0")
    with pytest.raises(DumpError, match=r"runs: old_<rank> \(1 in \.\); nccl_trace_rank_<rank> \(3 in a, b, c\); keep"):
        find_run(three, NO_ENV)


def test_the_prefix_the_environment_names_is_read_and_said(tmp_path: Path) -> None:
    root = _files(tmp_path, "nccl_trace_rank_0", "mine_0", "mine_1")
    for name in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        run = find_run(root, {name: "/somewhere/mine_"})
        assert (run.prefix, sorted(run.dumps)) == ("mine_", [0, 1])
        assert run.rule == "read mine_<rank>, the prefix TORCH_FR_DUMP_TEMP_FILE names"
        assert run.left == {"nccl_trace_rank_": [root / "nccl_trace_rank_0"]}
    with pytest.raises(DumpError, match="several runs"):
        find_run(root, {"TORCH_FR_DUMP_TEMP_FILE": "/somewhere/other_"})


def test_the_shims_own_prefix_is_no_rule_a_user_set(tmp_path: Path) -> None:
    """Only a prefix from the environment chooses among several: the shim's default name is always in the list."""
    assert dump_prefixes({}) == ["fr_trace_rank_"]
    assert dump_prefixes({"TORCH_FR_DUMP_TEMP_FILE": "/x/a_", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/y/b_"}) == [
        "a_", "b_", "fr_trace_rank_"
    ]  # fmt: skip
    assert dump_prefixes({"TORCH_FR_DUMP_TEMP_FILE": ""}) == ["fr_trace_rank_"]
    root = _files(tmp_path, "fr_trace_rank_0", "nccl_trace_rank_0")
    with pytest.raises(DumpError, match="several runs"):
        find_run(root, {})


def test_the_prefixes_come_from_this_processs_environment_by_default(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", "/tmp/job_")
    monkeypatch.delenv("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", raising=False)
    assert dump_prefixes() == ["job_", "fr_trace_rank_"]
    run = find_run(_files(tmp_path, "job_0", "nccl_trace_rank_0"))
    assert run.prefix == "job_"


def test_a_run_s_group_maps_and_stack_files_are_no_strays_even_under_a_short_prefix(tmp_path: Path) -> None:
    """Under a prefix as short as ``fr_``, the shim's group maps and stack files start with it too: they are the
    run's files, not strays; a file whose rest is not a rank is one."""
    names = ("fr_0", "fr_1", "fr_groups_rank_0.json", "fr_stack_rank_1.txt", "fr_7.txt")
    run = find_run(_files(tmp_path, *names), NO_ENV)
    assert run.prefix == "fr_" and sorted(run.dumps) == [0, 1]
    assert [p.name for p in run.strays] == ["fr_7.txt"]
    assert (sorted(run.sidecars), sorted(run.stacks)) == ([0], [1])


def test_a_folder_named_like_a_rank_s_dump_is_refused_and_no_other_folder_is(tmp_path: Path) -> None:
    for name in ("nccl_trace_rank_x", "mccl_trace_rank_5", "nccl_trace_rank_05", "nccl_trace_rank_"):
        root = _files(tmp_path / name, "nccl_trace_rank_0", "nccl_trace_rank_1")
        (root / name).mkdir(exist_ok=True)
        assert sorted(find_run(root, NO_ENV).dumps) == [0, 1], name  # not a rank's name under the run's prefix
    root = _files(tmp_path / "bad", "nccl_trace_rank_0", "nccl_trace_rank_1")
    (root / "nccl_trace_rank_2").mkdir()
    with pytest.raises(DumpError, match=r"nccl_trace_rank_2 is a directory, not a regular file.*like rank 2's dump"):
        find_run(root, NO_ENV)


def test_a_rank_s_name_is_ascii_digits_without_a_leading_zero() -> None:
    assert [is_rank_text(t) for t in ("0", "7", "10", "9" * RANK_DIGITS)] == [True] * 4
    refused = ("", "٣", "1٣", "²", "1a", "a1", "01", "00", " 1", "-1", "9" * (RANK_DIGITS + 1))
    assert [t for t in refused if is_rank_text(t)] == []


def test_a_non_ascii_rank_beside_real_dumps_is_a_stray_not_a_refusal(tmp_path: Path) -> None:
    """Only a folder whose every rank-like name is not ASCII is refused; beside real dumps such a file is a stray."""
    run = find_run(_files(tmp_path, "nccl_trace_rank_0", "nccl_trace_rank_1", "nccl_trace_rank_٣"), NO_ENV)
    assert sorted(run.dumps) == [0, 1] and [p.name for p in run.strays] == ["nccl_trace_rank_٣"]
