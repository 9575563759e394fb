"""Hang scenarios whose truth is known, and the hang report scored against them (#42).

:mod:`.truth` holds the typed seam every drawer of scenarios and the scorer share. Drawers write a folder of dumps
and return a :class:`~.truth.Scenario`; the scorer runs the command on the folder and calls the report right, honest
or wrong against the scenario's :class:`~.truth.Truth`.
"""
