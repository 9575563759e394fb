"""Input anyone with access to a shared folder may have written: read as a regular file, never blocking, bounded.

:mod:`.files` reads such a file. The hang report reads its dumps, stack files and group maps through it; the
command's NeMo RL reader reads a recipe through it.
"""

from __future__ import annotations

__all__: list[str] = []
