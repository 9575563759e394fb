"""Reading the ranks' stack files: where each rank was when its watched block ran past its deadline.

The files are ``fr_stack_rank_<rank>.txt`` (:data:`~nemo_rl_shim.flight_recorder.names.STACK_FILE_NAME`), in the
dump folder and its subfolders, as :mod:`nemo_rl_shim.flight_recorder.stack_watchdog` writes them: one header line
(:data:`~nemo_rl_shim.flight_recorder.names.HEADER` and JSON: rank, pid, the thread that armed, the block, when it
was entered, how long it could run), then faulthandler's text once the watchdog fired::

    Timeout (0:00:08)!
    Thread 0x00007f3a2b1c0740 (most recent call first):
      File "/job/train.py", line 57 in load_batch
      File "/job/train.py", line 80 in main

Once the watchdog fired, the rank writes its stack again while it stays in the block, each time after a line
(:data:`~nemo_rl_shim.flight_recorder.names.SAMPLE_MARK` and JSON: the sample's number and time): every sample is
read (:attr:`RankStack.samples`: the watched thread's frames and when), the newest gives :attr:`RankStack.frames`.
Whether the rank moved between them is :mod:`.progress`'s to judge.

A file with the header alone: the rank was inside the block when it last wrote, before the deadline
(it ended, or had not yet run that long). An empty file: it was in no watched block. A file of
faulthandler's text without the header (a loop that arms ``faulthandler.dump_traceback_later`` itself)
reads too; its thread is the one faulthandler lists last (the oldest: the main thread).

Like the dumps, the files come from shared folders: each is read as a regular file that may not leave the folder
(:mod:`nemo_rl_shim.untrusted.files`: a FIFO, a device, a socket or a symlink out of the folder named like a stack
file is refused, exit 2), up to :data:`MAX_STACK_BYTES`, as text, with regular expressions; nothing in it is run, a
line that is not faulthandler's is skipped, and a file that cannot be read (gone, not allowed) is kept with a note
rather than stopping the report (a stack is a help, not the evidence).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_shim.flight_recorder.names import HEADER, SAMPLE_MARK
from nemo_rl_shim.hang_report.bounds import is_count
from nemo_rl_shim.hang_report.folder import stack_files, walk
from nemo_rl_shim.hang_report.frames import Frame, frame, is_runtime_frame, user_frame
from nemo_rl_shim.hang_report.records import DumpError
from nemo_rl_shim.one_line.printable import clean, shown_path
from nemo_rl_shim.untrusted.files import NotRegularFile, UntrustedFileError, read_untrusted

__all__ = [
    "MAX_STACK_BYTES",
    "Frame",
    "RankStack",
    "StackSample",
    "find_stacks",
    "group_stacks",
    "is_runtime_frame",
    "load_stacks",
    "parse_stack",
    "read_stack",
    "read_stacks",
]

#: A stack file is read up to this size (faulthandler writes at most 100 threads of 100 frames).
MAX_STACK_BYTES = 1 << 20
#: A thread's first line (``Stack ...`` where faulthandler dumps one thread), across the text.
_THREAD = re.compile(
    r"^(?:(?P<current>Current thread|Thread) (?P<id>0x[0-9a-fA-F]+)(?: \[.*\])? \(most recent call first\):"
    r"|(?P<single>Stack) \(most recent call first\):)$",
    re.MULTILINE,
)
_FRAME = re.compile(r'^  File "(.*)", line ([0-9]+|\?\?\?) in (.*)$', re.MULTILINE)
#: Lines that start a new dump in one file: faulthandler's own (the watchdog's first sample; a plain faulthandler
#: user's file, re-armed without emptying it) and the stack watch's mark before each further sample.
_DUMP_START = re.compile(
    r"^(?:Timeout \(|Fatal Python error|Windows fatal exception|" + re.escape(SAMPLE_MARK) + r"(?P<mark>.*)$)",
    re.MULTILINE,
)
_CUT = re.compile(r"^ *\.\.\.$", re.MULTILINE)
_COLLECTIVE = re.compile(r"[/\\]torch[/\\]distributed[/\\]")


@dataclass(frozen=True)
class StackSample:
    """One sample of the watched thread: its frames (innermost first), and when (``time.time_ns``; None where the
    file does not say)."""

    frames: tuple[Frame, ...]
    t_ns: int | None = None


@dataclass
class RankStack:
    """One rank's stack file, read: the watched thread's frames (innermost first) and the header's facts."""

    rank: int
    path: Path
    frames: tuple[Frame, ...] = ()  # the newest sample's
    samples: tuple[StackSample, ...] = ()  # every sample, oldest first
    tid: int | None = None  # the watched thread's id in the kernel
    planned: int | None = None  # samples the header planned, and how far apart
    interval_s: float | None = None
    fired: bool = False  # faulthandler wrote a stack
    what: str | None = None  # the watched block
    after_s: float | None = None  # how long the block could run before the stack was written
    entered_ns: int | None = None
    pid: int | None = None
    thread: str | None = None  # the watched thread, as faulthandler names it
    threads: int = 0  # threads in the stack
    other_threads: dict[str, Frame | None] = field(default_factory=dict)  # thread -> its innermost frame
    truncated: bool = False  # faulthandler cut it ("..."), or the file was longer than read
    note: str = ""  # why a file says less than it should
    said_rank: int | None = None  # the rank its header says wrote it (the file name's, or the file is refused)

    @property
    def user_frame(self) -> Frame | None:
        """The innermost frame outside torch, the shim and the standard library (:func:`.frames.user_frame`); where
        every frame is theirs, the innermost one: it is still where the rank was."""
        return user_frame(self.frames) or (self.frames[0] if self.frames else None)

    @property
    def in_torch_distributed(self) -> bool:
        """Whether the watched thread is inside ``torch.distributed`` (a collective, a store, a barrier)."""
        return any(_COLLECTIVE.search(f.file) for f in self.frames)

    @property
    def ran_s(self) -> float | None:
        """How long the block had run at the newest sample (its time less the block's entry), else at the first
        (``after_s``); None where the file does not say."""
        newest = self.samples[-1].t_ns if self.samples else None
        if newest is not None and self.entered_ns is not None and newest >= self.entered_ns:
            return (newest - self.entered_ns) / 1e9
        return self.after_s

    @property
    def since(self) -> str:
        """``8.0 s into "train step"``: how long the block had run when the (newest) stack was written."""
        into = f' into "{self.what}"' if self.what else ""
        ran = self.ran_s
        return f"{ran:.1f} s{into}" if ran is not None else f"past its deadline{into}"

    def to_json(self) -> dict[str, Any]:
        user = self.user_frame
        return {
            "file": str(self.path),
            "fired": self.fired,
            "what": self.what,
            "after_s": self.after_s,
            "entered_ns": self.entered_ns,
            "pid": self.pid,
            "thread": self.thread,
            "tid": self.tid,
            "samples": [{"t_ns": x.t_ns, "frames": [f.to_json() for f in x.frames]} for x in self.samples],
            "user_frame": user.to_json() if user else None,
            "in_torch_distributed": self.in_torch_distributed,
            "frames": [f.to_json() for f in self.frames],
            "other_threads": {t: (f.to_json() if f else None) for t, f in self.other_threads.items()},
            "truncated": self.truncated,
            "note": self.note,
        }


def _header(line: str, stack: RankStack) -> None:
    try:
        facts = json.loads(line[len(HEADER) :])
    except ValueError as e:
        stack.note = f"header is not JSON ({e})"
        return
    if not isinstance(facts, Mapping):
        stack.note = f"header is not a JSON object (got {type(facts).__name__})"
        return
    what, after, entered, pid, thread = (facts.get(k) for k in ("what", "after_s", "entered_ns", "pid", "thread"))
    stack.said_rank = facts["rank"] if is_count(facts.get("rank")) else None
    stack.what = clean(what) if isinstance(what, str) else None
    stack.after_s = _seconds(after)
    stack.entered_ns = entered if is_count(entered) else None
    stack.pid = pid if is_count(pid) and pid < 2**32 else None
    stack.thread = thread.lower() if isinstance(thread, str) and re.fullmatch(r"0x[0-9a-fA-F]{1,32}", thread) else None
    stack.tid, stack.planned, stack.interval_s = _int(facts.get("tid")), _int(facts.get("samples")), None
    stack.interval_s = _seconds(facts.get("interval_s"))


def _int(value: Any) -> int | None:
    return value if is_count(value) else None


def _seconds(value: Any) -> float | None:
    ok = type(value) in (int, float) and 0 <= value < 1e9  # NaN fails both
    return float(value) if ok else None


#: Frames already made, by their line: the ranks of one job share most of their frames (bounded, for hostile files).
_BY_LINE: dict[str, Frame] = {}
_BY_LINE_MAX = 100_000


def _frame(match: re.Match[str]) -> Frame:
    line = match.group(0)
    found = _BY_LINE.get(line)
    if found is None:
        file, number, function = match.groups()
        found = frame(file, int(number) if number.isdigit() else None, function)
        if len(_BY_LINE) < _BY_LINE_MAX:
            _BY_LINE[line] = found
    return found


def _frames(block: str, first_only: bool = False) -> list[Frame]:
    if first_only:
        match = _FRAME.search(block)
        return [_frame(match)] if match else []
    return [_frame(match) for match in _FRAME.finditer(block)]


def _choose(heads: list[re.Match[str]], ids: list[str | None], wanted: str | None, marked: bool) -> int:
    """The watched thread's place among a sample's threads: the header's thread; else faulthandler's current thread
    (not in a marked sample, where it is the sampler thread itself); else the last listed (the oldest: the main)."""
    chosen = next((i for i, ident in enumerate(ids) if wanted and ident == wanted), None)
    if chosen is None and not marked:
        chosen = next((i for i, m in enumerate(heads) if m["single"] or m["current"] == "Current thread"), None)
    if chosen is None and marked:
        chosen = next((i for i in range(len(heads) - 1, -1, -1) if heads[i]["current"] != "Current thread"), None)
    return len(heads) - 1 if chosen is None else chosen


def _sample_time(mark: str | None, first: bool, stack: RankStack) -> int | None:
    """When a sample was written: its mark's ``t_ns``; for the watchdog's first, the block's deadline."""
    if mark is None:
        if first and stack.entered_ns is not None and stack.after_s is not None:
            return stack.entered_ns + round(stack.after_s * 1e9)
        return None
    try:
        facts = json.loads(mark)
    except ValueError:
        return None
    return _int(facts.get("t_ns")) if isinstance(facts, Mapping) else None


def _read_sample(text: str, stack: RankStack, mark: str | None, first: bool) -> StackSample | None:
    """One sample's text: the watched thread's frames (and, kept on ``stack``, the others' innermost frames)."""
    heads = list(_THREAD.finditer(text))
    if not heads:
        return None
    ids = [None if m["single"] else m["id"].lower() for m in heads]
    chosen = _choose(heads, ids, stack.thread, marked=mark is not None)
    ends = [m.start() for m in heads[1:]] + [len(text)]
    blocks = [text[m.end() : end] for m, end in zip(heads, ends, strict=True)]
    stack.threads = len(heads)
    stack.thread = stack.thread or ids[chosen]
    stack.other_threads = {
        str(ident): next(iter(_frames(block, first_only=True)), None)
        for i, (ident, block) in enumerate(zip(ids, blocks, strict=True))
        if i != chosen
    }
    return StackSample(tuple(_frames(blocks[chosen])), _sample_time(mark, first, stack))


def parse_stack(text: str, rank: int, path: Path) -> RankStack:
    """A stack file's text, read (see the module docstring). The regular expressions run over the whole text:
    at a thousand files a report, a loop over lines in Python cost more than reading them."""
    stack = RankStack(rank, path)
    if text.startswith(HEADER):
        first, _, text = text.partition("\n")
        _header(first, stack)
    stack.truncated = _CUT.search(text) is not None
    starts = list(_DUMP_START.finditer(text))
    if not starts or starts[0].start() > 0:  # threads before any start line: a sample of their own
        starts.insert(0, None)  # type: ignore[arg-type]
    ends = [m.start() for m in starts[1:]] + [len(text)]
    samples = []
    for start, end in zip(starts, ends, strict=True):
        body = text[start.end() if start else 0 : end]
        mark = start["mark"] if start is not None and start["mark"] is not None else None
        found = _read_sample(body, stack, mark, first=not samples and mark is None)
        if found is not None:
            samples.append(found)
    if not samples:
        return stack
    stack.fired, stack.samples, stack.frames = True, tuple(samples), samples[-1].frames
    return stack


def read_stack(path: Path, rank: int, root: Path | None = None) -> RankStack:
    """One stack file, read as text up to :data:`MAX_STACK_BYTES`; one that cannot be read is kept with a note, one
    that is not a regular file (or a symlink out of ``root``), or whose header names another rank, is refused
    (:class:`DumpError`)."""
    try:
        data = read_untrusted(path, cap=MAX_STACK_BYTES, what="stack file", root=root, cut=True)
    except NotRegularFile as e:
        raise DumpError(str(e)) from None
    except UntrustedFileError as e:
        return RankStack(rank, path, note=f"cannot be read: {str(e).rpartition(': ')[2]}")
    stack = parse_stack(data[:MAX_STACK_BYTES].decode("utf-8", errors="replace"), rank, path)
    if stack.said_rank is not None and stack.said_rank != rank:  # stack_watchdog.header_line writes its own rank
        raise DumpError(
            f"{shown_path(path)}: its header says rank {stack.said_rank} wrote it, its file name says rank {rank}"
        )
    if len(data) > MAX_STACK_BYTES:
        stack.truncated = True
        stack.note = stack.note or f"longer than {MAX_STACK_BYTES} bytes: read that far"
    return stack


def find_stacks(directory: str | os.PathLike[str]) -> dict[int, Path]:
    """``{rank: stack file}`` in ``directory`` and its subfolders (hidden ones skipped); a rank with two is refused."""
    return stack_files(walk(Path(directory)))


def read_stacks(paths: Mapping[int, Path], root: Path | None = None) -> dict[int, RankStack]:
    """The stack files ``paths`` (``{rank: file}``), read; ranks sorted."""
    return {rank: read_stack(path, rank, root) for rank, path in sorted(paths.items())}


def load_stacks(directory: str | os.PathLike[str]) -> dict[int, RankStack]:
    """Every rank's stack file in ``directory``, read; ranks sorted."""
    return read_stacks(find_stacks(directory), Path(os.path.realpath(directory)))


def group_stacks(stacks: Mapping[int, RankStack]) -> list[tuple[tuple[Frame, ...], list[int]]]:
    """The written stacks grouped by identical frames, the outliers first: ``[(frames, ranks), ...]`` by how
    few ranks share them, then by the first rank."""
    groups: dict[tuple[Frame, ...], list[int]] = {}
    for rank, stack in sorted(stacks.items()):
        if stack.fired:
            groups.setdefault(stack.frames, []).append(rank)
    return sorted(groups.items(), key=lambda item: (len(item[1]), item[1][0]))
