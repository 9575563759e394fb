"""What every one-line report is made of: an exception's first line, and a list of ranks as a person reads it.

Owns :mod:`.exception` (``first_line``) and :mod:`.rank_ranges` (``format_ranks``, ``rank_runs``): one home
each, so that preflight, the dry run, the audit and the hang report say the same thing the same way.

May import: the standard library and :mod:`nemo_rl_shim.config` (its integer check). No torch: the hang report
uses both. No name is re-exported here: import from the module that owns it.
"""
