"""The test harness: the repository's paths, skips, release wheels and their facts, fixture wheels, commands at once."""
