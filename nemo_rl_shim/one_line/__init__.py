"""What every one-line report is made of: an exception's first line, a list of ranks as a person reads it, and text
from an untrusted file made printable.

Owns :mod:`.exception` (``first_line``), :mod:`.rank_ranges` (``format_ranks``, ``rank_runs``) and
:mod:`.printable` (``clean``, ``shown``, ``shown_path``, ``encodable``): one home each, so that preflight, the dry
run, the audit and the hang report say the same thing the same way.

May import: the standard library and :mod:`nemo_rl_shim.config` (its integer check). No torch: the hang report
uses both. No name is re-exported here: import from the module that owns it.
"""
