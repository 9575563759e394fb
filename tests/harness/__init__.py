"""The test harness: the repository's paths, skips, release wheels and their facts, fixture wheels, commands at once, a
tiny wheel, and harvested NCCL dumps read against their truth (``real_nccl``)."""
