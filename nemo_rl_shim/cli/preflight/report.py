"""The report of ``nemo-rl-shim preflight``: what is wrong (one line), and the table.

:class:`PreflightReport` holds every rank's result (:data:`~nemo_rl_shim.cli.preflight.results.RankOutcome`:
what :func:`~nemo_rl_shim.cli.preflight.rank_checks.check_rank` returned, or the rank's failure);
:func:`find_problems` reads the configured values from the options and lists every mismatch. The rows are
every group torch holds, each backend's timeout judged by the audit (:class:`nemo_rl_shim.audit.TimeoutSource`).
With a timeout configured:

* a backend at torch's default is a problem, on any group: the line names the group (its name or
  description), its ranks, the backend and the value; when several groups are, a first line names them all;
* a group the meshes name (the default group, a mesh, flattened or MoE axis) must carry the configured
  value: any other is a problem, as is a missing CPU half under CPU offload;
* any other group with a value of its own keeps it: shown as ``(own)``, not a problem;
* a backend whose timeout cannot be read (torch's bare ``fake`` backend) is a problem: it was not checked.

:func:`off_the_checked_path` says when the config's job does not run on the path that was checked;
:func:`render_report` prints the table. Pure functions of data: nothing here touches torch.distributed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_shim.cli.preflight.options import PreflightOptions
from nemo_rl_shim.cli.preflight.results import GroupRow, RankChecked, RankFailed, RankOutcome
from nemo_rl_shim.cli.preflight.stuck import after_grace, past_deadline, ranks_named
from nemo_rl_shim.one_line.rank_ranges import format_ranks
from nemo_rl_shim.process_groups.later import TimeoutSource
from nemo_rl_shim.process_groups.setting import RESOLUTION

__all__ = ["COLUMNS", "PreflightReport", "find_problems", "groups_line", "off_the_checked_path", "render_report"]


@dataclass
class PreflightReport:
    """Every rank's result (or failure) and what is wrong with them."""

    launcher: str
    world_size: int
    options: PreflightOptions
    ranks: Sequence[RankOutcome]
    wall_s: float
    note: str | None = None
    timed_out: bool = False
    problems: list[str] = field(default_factory=list)
    #: Lines a runner adds under the heading (a dry run: which ranks, how many groups each).
    details: Sequence[str] = ()
    #: Keys a runner adds to the JSON.
    facts: dict[str, Any] = field(default_factory=dict)
    #: Whether the checks themselves found nothing; False with ``ok`` True never happens. With a config whose
    #: job runs elsewhere (``options.worker_note``), the report is not OK even when they found nothing.
    checks_passed: bool = True
    #: This process prints the report; this process is a rank of a launcher's world (the runner says both:
    #: :attr:`.runner.Runner.reports`, :attr:`.runner.Runner.joined`).
    reports: bool = True
    joined: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def problem(self) -> str | None:
        """One line: the first problem, and how many more there are."""
        if not self.problems:
            return None
        more = len(self.problems) - 1
        return self.problems[0] + (f" (+{more} more problem{'s' * (more > 1)})" if more else "")

    def to_json(self) -> dict[str, Any]:
        first = next((r for r in self.ranks if isinstance(r, RankChecked)), None)
        return {
            "ok": self.ok,
            "problem": self.problem,
            "problems": self.problems,
            "launcher": self.launcher,
            "world_size": self.world_size,
            "note": self.note,
            "timed_out": self.timed_out,
            "checks_passed": self.checks_passed,
            "wall_s": round(self.wall_s, 2),
            "role": self.options.role,
            "training_world": self.options.world_size,
            "training_world_source": self.options.world_source,
            "worker_note": self.options.worker_note,
            "section": self.options.section,
            "cpu_offload": self.options.cpu_offload,
            "timeout_minutes": self.options.timeout_minutes,
            "timeout_minutes_after_init": self.options.timeout_minutes_after_init,
            "decision": None if first is None or first.decision is None else dict(first.decision),
            "setup": self.options.setup,
            "default_backend": None if first is None else first.default_backend,
            "ranks": [rank.to_json() for rank in self.ranks],
            **self.facts,
        }


#: A problem before merging: (what is wrong, group name or None, rank).
_Found = tuple[str, "str | None", int]


def _merge(found: list[_Found]) -> list[str]:
    """One line per distinct problem, naming every group and rank it occurred on, in first-seen order."""
    merged: dict[str, tuple[list[str], list[int]]] = {}
    for detail, group, rank in found:
        groups, ranks = merged.setdefault(detail, ([], []))
        if group is not None and group not in groups:
            groups.append(group)
        if rank not in ranks:
            ranks.append(rank)
    return [
        (f"group{'s' * (len(groups) > 1)} {', '.join(groups)}: " if groups else "") + f"{detail} ({ranks_named(ranks)})"
        for detail, (groups, ranks) in merged.items()
    ]


def _fmt(minutes: float | None) -> str:
    return "? min" if minutes is None else f"{minutes:g} min"


_DEFAULT, _OWN, _UNREADABLE = TimeoutSource.TORCH_DEFAULT.value, TimeoutSource.OWN.value, TimeoutSource.UNREADABLE.value
#: c10d keeps a timeout in whole milliseconds: two values closer than this are one (``every_group.RESOLUTION``).
_RESOLUTION_MIN = RESOLUTION.total_seconds() / 60


def _keeps_its_own(row: GroupRow, device: str) -> bool:
    """A group no mesh names, whose backend had a value of its own at start-up: it keeps it through every phase."""
    return not row.named and row.sources.get(device) == _OWN


@dataclass
class _AtDefault:
    """One row name's backends at torch's default, over every rank: its description, group ranks, and the ranks."""

    desc: str
    groups: list[tuple[int, ...]] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)


def _timeout_problems(
    row: GroupRow, minutes: Mapping[str, float | None] | None, sources: Mapping[str, str] | None,
    expected: float | None, when: str,
) -> tuple[list[str], str | None]:  # fmt: skip
    """The problems of one phase's timeouts on ``row``: (value and unreadable problems, the at-default detail or
    None). ``"cpu:gloo,cuda:gloo has 30 min, configured 45 min"`` per distinct wrong value."""
    if expected is None or minutes is None:
        return [], None
    sources = sources or {}
    wrong: dict[float | None, list[str]] = {}
    at_default: dict[float | None, list[str]] = {}
    unreadable: list[str] = []
    for device, timeout in minutes.items():
        backend = f"{device}:{row.backends.get(device, '?')}"
        source = sources.get(device)
        if source == _DEFAULT:
            at_default.setdefault(timeout, []).append(backend)
        elif source == _UNREADABLE or timeout is None:
            unreadable.append(backend)
        elif _keeps_its_own(row, device):
            continue
        elif abs(timeout - expected) >= _RESOLUTION_MIN:
            wrong.setdefault(timeout, []).append(backend)
    found = [f"{','.join(b)} has {_fmt(t)}{when}, configured {_fmt(expected)}" for t, b in wrong.items()]
    if unreadable:
        found.append(
            f"{','.join(unreadable)} keeps no timeout that can be read{when}: not checked against the configured "
            f"{_fmt(expected)}"
        )
    default = "; ".join(f"{','.join(b)} at torch's default {_fmt(t)}{when}" for t, b in at_default.items())
    return found, (f"{default}, configured {_fmt(expected)}" if default else None)


def _row_problems(
    row: GroupRow, startup: float | None, steady: float | None, offload: bool
) -> tuple[list[str], list[str]]:
    """The row's problems, and its at-default details (start-up, then after init)."""
    found, default = _timeout_problems(row, row.timeout_minutes, row.sources, startup, "")
    defaults = [default] if default else []
    if offload and "cpu" not in row.backends:
        backends = ",".join(f"{d}:{b}" for d, b in row.backends.items()) or "none"
        found.append(f"no CPU backend under CPU offload (backends {backends})")
    for kind, outcome in (("cpu", row.cpu_all_reduce), ("cuda", row.cuda_all_reduce)):
        if outcome.startswith("failed"):
            found.append(f"{kind.upper()} all_reduce {outcome}")
    steady_found, steady_default = _timeout_problems(
        row, row.timeout_minutes_after_init, row.sources_after_init, steady, " after init"
    )
    return found + steady_found, defaults + ([steady_default] if steady_default else [])


def _default_lines(at_default: Mapping[tuple[str, str], _AtDefault]) -> list[str]:
    """One line per group name left at torch's default (its description, its groups' ranks, the ranks that hold
    it), after a first line naming them all when there are several."""
    lines = []
    for (name, detail), seen in at_default.items():
        groups = " | ".join(dict.fromkeys(format_ranks(ranks) for ranks in seen.groups))
        where = f"group_desc {seen.desc}, group ranks {groups}"
        lines.append(f"group {name}: {detail} ({where}) ({ranks_named(seen.ranks)})")
    names = list(dict.fromkeys(name for name, _ in at_default))
    if len(names) > 1:
        lines.insert(0, f"{len(names)} groups at torch's default, not the configured timeout: {', '.join(names)}")
    return lines


def _last_line(text: str | None) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def find_problems(ranks: Sequence[RankOutcome], options: PreflightOptions, timed_out: bool = False) -> list[str]:
    """Everything wrong with the gathered rank results, one line each, the most telling first.

    ``timed_out``: the run reached ``--timeout-s``; the ranks without a result are named, not those
    that finished.
    """
    unfinished = [r for r in ranks if isinstance(r, RankFailed)]
    if timed_out:
        return [past_deadline([r.rank for r in unfinished], options.timeout_s, whole_s=options.timeout_whole_s)]
    failed: list[_Found] = [
        (f"rank failed: {_last_line(r.error)}", None, r.rank) for r in unfinished if not r.killed_because
    ]
    if failed:  # a rank's own error before "exited -9 before reporting", and before the ranks killed after it
        return _merge(sorted(failed, key=lambda f: "before reporting" in f[0]))
    killed = [r for r in unfinished if r.killed_because]
    if killed:  # killed by the launcher after a peer gave up waiting on them: stalled
        stuck, why = [r.rank for r in killed], killed[0].killed_because or ""
        return [after_grace(stuck, why, "a rank is stuck in a collective")]
    startup, steady = options.timeout_minutes, options.timeout_minutes_after_init
    found: list[_Found] = []
    at_default: dict[tuple[str, str], _AtDefault] = {}
    for result in (r for r in ranks if isinstance(r, RankChecked)):
        for row in result.rows:
            problems, defaults = _row_problems(row, startup, steady, options.cpu_offload)
            found += [(p, row.group, result.rank) for p in problems]
            for detail in defaults if row.same_as is None else ():  # an alias: judged under its first name
                seen = at_default.setdefault((row.group, detail), _AtDefault(row.desc or row.group))
                seen.groups.append(row.ranks)
                seen.ranks.append(result.rank)
        offload = result.offload
        if offload is not None and offload.skipped is None and not offload.ok:
            detail = f"full_tensor() of a CPU-offloaded parameter on mesh {offload.mesh} failed: {offload.error}"
            found.append((detail, None, result.rank))
    return _default_lines(at_default) + _merge(found)


def off_the_checked_path(options: PreflightOptions) -> str | None:
    """The problem of a config whose job does not run on the path preflight checks (v1 DTensor, Megatron), or None.

    Preflight runs the Automodel path's set-up; a config that NeMo RL runs elsewhere
    (:func:`nemo_rl_shim.cli.nemo_rl.worker_note`) cannot pass, whatever that set-up shows.
    """
    return options.worker_note


# --- rendering -------------------------------------------------------------------------------

#: Columns of the group table, in order.
COLUMNS = ("group", "ranks", "backends", "timeout", "after init", "cpu all_reduce", "cuda all_reduce")


#: How the table marks a timeout that is not the configured value.
_MARKS = {_DEFAULT: "torch default", _OWN: "own", _UNREADABLE: "unreadable"}


def _timeouts(minutes: Mapping[str, float | None] | None, sources: Mapping[str, str] | None = None) -> str:
    """``"45 min"``, ``"cpu 45 / cuda 30 min (cuda: torch default)"``, ``"30 min (torch default)"``."""
    if minutes is None:
        return "-"
    values = set(minutes.values())
    if len(values) == 1:
        text = _fmt(values.pop())
    else:
        text = " / ".join(f"{device} {'?' if value is None else f'{value:g}'}" for device, value in minutes.items())
        text += " min"
    marked = {device: _MARKS[source] for device, source in (sources or {}).items() if source in _MARKS}
    if not marked:
        return text
    if len(marked) == len(minutes) and len(set(marked.values())) == 1:
        return f"{text} ({next(iter(marked.values()))})"
    return f"{text} ({', '.join(f'{device}: {mark}' for device, mark in marked.items())})"


def _cells(row: GroupRow) -> dict[str, str]:
    return {
        "ranks": format_ranks(row.ranks),
        "backends": ",".join(f"{d}:{b}" for d, b in row.backends.items()) or "none",
        "timeout": _timeouts(row.timeout_minutes, row.sources),
        "after init": _timeouts(row.timeout_minutes_after_init, row.sources_after_init),
        "cpu all_reduce": row.cpu_all_reduce,
        "cuda all_reduce": row.cuda_all_reduce.replace(" (no CUDA device)", ""),
    }


def _table(ranks: Sequence[RankChecked]) -> list[list[str]]:
    """One line per group; a cell whose value differs between ranks lists each rank's value."""
    per_group: dict[str, list[dict[str, str]]] = {}
    for result in ranks:
        for row in result.rows:
            per_group.setdefault(row.group, []).append({"rank": str(result.rank), **_cells(row)})
    lines = []
    for name, cells in per_group.items():
        line = [name]
        for column in COLUMNS[1:]:
            values = list(dict.fromkeys(c[column] for c in cells))
            if column == "ranks":
                shown = values if len(values) <= 4 else [*values[:2], "...", values[-1]]
                line.append(" | ".join(shown) + ("" if len(values) <= 4 else f" ({len(values)} groups)"))
            else:
                line.append(values[0] if len(values) == 1 else "; ".join(f"r{c['rank']}: {c[column]}" for c in cells))
        lines.append(line)
    return lines


def _format_table(lines: list[list[str]]) -> list[str]:
    rows = [list(COLUMNS), *lines]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _offload_line(ranks: Sequence[RankChecked]) -> str:
    facts = [r.offload for r in ranks if r.offload is not None]
    if not facts:
        return "CPU offload: off (no full_tensor() check)"
    skipped = next((f.skipped for f in facts if f.skipped is not None), None)
    if skipped is not None:
        return f"CPU offload: full_tensor() check {skipped}"
    first = facts[0]
    outcome = "ok on every rank" if all(f.ok for f in facts) else "FAILED"
    shapes = f"{first.local_device or '?'} shards {tuple(first.local_shape or ())}"
    return (
        f"CPU offload: {first.method}, mesh {first.mesh} ranks {format_ranks(first.mesh_ranks)}: "
        f"{shapes} -> full_tensor() {tuple(first.full_shape or ())}: {outcome}"
    )


def _node_line(ranks: Sequence[RankOutcome]) -> list[str]:
    nodes = [(r.rank, r.node) for r in ranks if r.node is not None]
    if not nodes:
        return []
    where = ", ".join(f"rank {rank} on {n.node_ip} (host {n.host}, node {n.node_id[:8]})" for rank, n in nodes)
    return [f"nodes: {where}"]


def _world_line(report: PreflightReport) -> list[str]:
    """Where the training world came from, and whether this run checks all of it."""
    size, source = report.options.world_size, report.options.world_source
    if size is None:
        return []
    checked = "" if size == report.world_size else f"; this run checks {report.world_size} ranks"
    return [f"training world: {size} rank{'s' * (size != 1)}, from {source}{checked}"]


def _own_groups(report: PreflightReport) -> str:
    """``"; groups with a timeout of their own: undefined"``, or nothing."""
    names = [
        row.group
        for result in report.ranks
        if isinstance(result, RankChecked)
        for row in result.rows
        if any(_keeps_its_own(row, device) for device in row.sources)
    ]
    return f"; groups with a timeout of their own: {', '.join(dict.fromkeys(names))}" if names else ""


def _what_passed(report: PreflightReport) -> str:
    configured = report.options.timeout_minutes is not None
    if report.options.dry_run:
        return (
            "every group torch holds carries the configured timeout on every backend (dry run: no collective run)"
            + _own_groups(report)
            if configured
            else "every group built (dry run; no timeout configured: torch's defaults apply)"
        )
    passed = "every group torch holds carries the configured timeout on every backend; collectives work"
    return (
        passed + _own_groups(report)
        if configured
        else "collectives work (no timeout configured: torch's defaults apply)"
    )


def _verdict(report: PreflightReport) -> list[str]:
    """``OK: ...`` when nothing is wrong; what the checks found on a path the config does not run; else nothing
    (a failure is the caller's one line, :attr:`PreflightReport.problem`, not repeated here)."""
    if report.ok:
        return [f"OK: {_what_passed(report)}"]
    if report.checks_passed and report.options.worker_note:
        return [f"checked the Automodel path, which this config does not run (note above): {_what_passed(report)}"]
    return []


def _shared(rows: Sequence[GroupRow]) -> str:
    """``"dp_shard, dp are group default"``: rows that are the same group as an earlier row."""
    same: dict[str, list[str]] = {}
    for row in rows:
        if row.same_as is not None:
            same.setdefault(row.same_as, []).append(row.group)
    return "; ".join(f"{', '.join(names)} {'are' if len(names) > 1 else 'is'} group {of}" for of, names in same.items())


def groups_line(ranks: Sequence[RankChecked], title: str, groups_of: Callable[[RankChecked], int] | None = None) -> str:
    """``"<title>: 11 on ranks 0-3, shown as the table's 13 rows (dp_shard, dp are group default)"``: how many groups
    each checked rank holds (``groups_of``; by default its rows that are not another row's group), and how the
    table's rows show them (a row per name: names of the same group share it)."""
    by_shape: dict[tuple[int, int, str], list[int]] = {}
    for result in ranks:
        groups = groups_of(result) if groups_of else sum(row.same_as is None for row in result.rows)
        by_shape.setdefault((groups, len(result.rows), _shared(result.rows)), []).append(result.rank)
    parts = []
    for (groups, rows, shared), on in sorted(by_shape.items()):
        part = f"{groups} on rank{'s' * (len(on) > 1)} {format_ranks(on)}"
        if rows != groups:
            part += f", shown as the table's {rows} rows" + (f" ({shared})" if shared else "")
        parts.append(part)
    return f"{title}: {'; '.join(parts) or 'none checked'}"


def _set_up_lines(first: RankChecked) -> list[str]:
    """What set the groups up: the shim's decision, or NeMo RL's own set-up; then the groups made after it."""
    decision = first.decision
    if decision is None:
        lines = [f"set-up: {first.set_up or 'unknown'}"]
    else:
        lines = [
            f"decision: {decision['action']}: {decision['reason']}",
            *([f"warning: {decision['warning']}"] if decision["warning"] else []),
        ]
    if first.later_groups:
        lines.append(f"made after set-up, as a NeMo RL worker makes them: {'; '.join(first.later_groups)}")
    return lines


def render_report(report: PreflightReport) -> str:
    """The text ``nemo-rl-shim preflight`` prints."""
    options = report.options
    startup, steady = options.timeout_minutes, options.timeout_minutes_after_init
    head = [f"preflight: {report.world_size} ranks ({report.launcher}), {options.role} section"]
    head += _world_line(report)
    head += list(report.details)
    if options.worker_note:
        head.append(f"note: {options.worker_note}")
    if report.note:
        head.append(f"note: {report.note}")
    head.append(
        f"timeouts: start-up {_fmt(startup) if startup is not None else 'unset (torch defaults)'}; after init "
        f"{_fmt(steady) if steady is not None else 'unset (start-up value kept all run)'}"
    )
    head += _node_line(report.ranks)
    complete = [r for r in report.ranks if isinstance(r, RankChecked)]
    if complete and len(complete) == len(report.ranks):
        first = complete[0]
        head += [
            f"default group: {first.default_backend} on {first.device}; CPU offload "
            f"{'on' if options.cpu_offload else 'off'}",
            *_set_up_lines(first),
            *([] if options.dry_run else [groups_line(complete, "process groups per rank (every group torch holds)")]),
            "",
            *_format_table(_table(complete)),
            "(ranks '0 | 1': a separate group on each rank)",
            "",
            _offload_line(complete) if not options.dry_run else "CPU offload: full_tensor() check not run (dry run)",
        ]
    head += _verdict(report)
    head.append(f"wall: {report.wall_s:.1f} s")
    if "hang_report" in report.facts:  # the run failed with the Flight Recorder on: who did not join
        head.append(report.facts["hang_report"]["summary"])
    return "\n".join(head)
