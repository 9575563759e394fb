"""Rank-side test code: the functions ``spawn_ranks`` runs on every rank (``"tests.ranks.<module>:<function>"``)."""
