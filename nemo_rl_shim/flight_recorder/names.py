"""The recorder's names that a reader of its files needs: file names, keys, torch's variables. No torch.

The writer (:mod:`.recorder`, :mod:`.stack_watchdog`) and the reader (``nemo-rl-shim hang-report``, which
imports no torch) take them from here, so that both always agree and the reader never imports the writer.
"""

from __future__ import annotations

__all__ = [
    "DUMP_FILE_NAME",
    "ENV_PAIRS",
    "HEADER",
    "PG_STATUS_KEY",
    "PROGRESS_FILE_NAME",
    "SAMPLE_MARK",
    "SIDECAR_NAME",
    "STACK_FILE_NAME",
    "TORCH_DEFAULT_PREFIX",
]

#: Dump file name before the rank (torch's default is ``/tmp/nccl_trace_rank_``).
DUMP_FILE_NAME = "fr_trace_rank_"
#: The group map beside each dump; its name does not contain :data:`DUMP_FILE_NAME`, so torch's loader skips it.
SIDECAR_NAME = "fr_groups_rank_{rank}.json"
#: torch's variable names, newest first: setting the first when none of the pair is set.
ENV_PAIRS: dict[str, tuple[str, ...]] = {
    "buffer_size": ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
    "dump_file": ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
    "dump_on_timeout": ("TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_ON_TIMEOUT"),
}
#: Where :func:`~.recorder.dump_now` joins several recorders, their ``pg_status`` (keyed by ``pg_id``, which each
#: recorder counts from 0 by itself) is keyed by recorder and ``pg_id`` instead.
PG_STATUS_KEY = "{backend}/{pg_id}"
#: torch's own dump-file prefix, where neither dump-file variable is set (its NCCL watchdog writes ``<prefix><rank>``).
TORCH_DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
#: The stack file of a rank, beside its dump (the name does not end in a digit: dump readers skip it).
STACK_FILE_NAME = "fr_stack_rank_{rank}.txt"
#: The first line of a stack file starts with this; JSON follows on the same line.
HEADER = "nemo-rl-shim stack "
#: Before each stack sample after the first (the C watchdog's, which starts with ``Timeout (``), a line that starts
#: with this, then JSON (``{"sample": i, "t_ns": ...}``): the stack watch samples more than once.
SAMPLE_MARK = "nemo-rl-shim sample "
#: Beside the stack file: the process's and the watched thread's CPU time and I/O counters at each sample, one JSON
#: object a line, written by a helper process that needs no GIL of the rank (the name does not end in a digit).
PROGRESS_FILE_NAME = "fr_progress_rank_{rank}.jsonl"
