"""Reading a rank's counters file: its CPU time and I/O counters at each stack sample, as the helper wrote them.

The file is ``fr_progress_rank_<rank>.jsonl`` (:data:`~nemo_rl_shim.flight_recorder.names.PROGRESS_FILE_NAME`) beside
the rank's stack file, one JSON object a line, as :mod:`nemo_rl_shim.flight_recorder.progress_sampler` writes it:
the sample's number and time, the block's ``entered_ns`` and the rank's ``pid`` (the stack file's header names the
same block), then ``process`` and ``thread`` (the thread that armed the block), each ``{"state", "cpu_s", "io":
{"rchar", "wchar", "read_bytes", "write_bytes"}}`` or null.

Like the stacks, it comes from a shared folder: read as a regular file that may not leave the folder
(:mod:`nemo_rl_shim.untrusted.files`: a FIFO, a device or a symlink out of the folder under that name is refused,
as a stack file would be), up to :data:`MAX_COUNTER_BYTES`, each line parsed as JSON and each field checked for its
type; a line that is not a sample is skipped, a file that cannot be read gives no sample (counters are a help, never
the evidence of a hang). Only the samples of the block the stack file names count.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_rl_shim.flight_recorder.names import PROGRESS_FILE_NAME
from nemo_rl_shim.hang_report.bounds import is_count
from nemo_rl_shim.hang_report.records import DumpError
from nemo_rl_shim.hang_report.stacks import RankStack
from nemo_rl_shim.untrusted.files import NotRegularFile, UntrustedFileError, read_untrusted

__all__ = ["MAX_COUNTER_BYTES", "CounterSample", "Counters", "counters_for", "parse_counters"]

#: A counters file is read up to this size (the helper writes a few lines of a few hundred bytes per block).
MAX_COUNTER_BYTES = 1 << 16
_IO_KEYS = ("rchar", "wchar", "read_bytes", "write_bytes")


@dataclass(frozen=True)
class Counters:
    """One task's counters (the process's, or one thread's): CPU seconds, its state letter, bytes read and written."""

    cpu_s: float | None
    state: str | None
    io: Mapping[str, int]  # rchar, wchar, read_bytes, write_bytes: those present

    def to_json(self) -> dict[str, Any]:
        return {"cpu_s": self.cpu_s, "state": self.state, "io": dict(self.io)}


@dataclass(frozen=True)
class CounterSample:
    """The counters at one sample of one block."""

    number: int
    t_ns: int
    pid: int | None
    entered_ns: int | None
    process: Counters | None
    thread: Counters | None

    def to_json(self) -> dict[str, Any]:
        return {
            "sample": self.number,
            "t_ns": self.t_ns,
            "process": self.process.to_json() if self.process else None,
            "thread": self.thread.to_json() if self.thread else None,
        }


def _int(value: Any) -> int | None:
    return value if is_count(value) else None


def _task(value: Any) -> Counters | None:
    if not isinstance(value, Mapping):
        return None
    cpu, state, io = value.get("cpu_s"), value.get("state"), value.get("io")
    ok_cpu = type(cpu) in (int, float) and 0 <= cpu < 1e12  # NaN fails both
    counts = {k: io[k] for k in _IO_KEYS if isinstance(io, Mapping) and _int(io.get(k)) is not None}
    return Counters(float(cpu) if ok_cpu else None, state[:1] if isinstance(state, str) else None, counts)


def _sample(line: str) -> CounterSample | None:
    try:
        facts = json.loads(line)
    except ValueError:
        return None
    if not isinstance(facts, Mapping):
        return None
    number, t_ns = _int(facts.get("sample")), _int(facts.get("t_ns"))
    if number is None or t_ns is None:
        return None
    thread = _task(facts.get("thread"))
    return CounterSample(
        number, t_ns, _int(facts.get("pid")), _int(facts.get("entered_ns")), _task(facts.get("process")), thread
    )


def parse_counters(data: bytes) -> list[CounterSample]:
    """Every sample in a counters file's bytes (read up to :data:`MAX_COUNTER_BYTES`), in file order."""
    text = data[:MAX_COUNTER_BYTES].decode("utf-8", errors="replace")
    return [s for line in text.splitlines() if (s := _sample(line)) is not None]


def counters_for(stack: RankStack, root: Path | None = None) -> tuple[CounterSample, ...]:
    """The counter samples, beside ``stack``'s file, of the block its header names (same ``pid`` and
    ``entered_ns``), by time; none where the file is missing, unreadable or of another block. One that is not a
    regular file, or a symlink out of ``root``, is refused (:class:`DumpError`)."""
    if stack.entered_ns is None:
        return ()
    path = Path(stack.path).parent / PROGRESS_FILE_NAME.format(rank=stack.rank)
    try:
        data = read_untrusted(path, cap=MAX_COUNTER_BYTES, what="counters file", root=root, cut=True)
    except NotRegularFile as e:
        raise DumpError(str(e)) from None
    except UntrustedFileError:
        return ()
    found = [
        s
        for s in parse_counters(data)
        if s.entered_ns == stack.entered_ns and (stack.pid is None or s.pid == stack.pid)
    ]
    return tuple(sorted(found, key=lambda s: s.t_ns))
