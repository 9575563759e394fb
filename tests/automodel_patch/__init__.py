"""Tests of :mod:`automodel_patch`: each workaround, its tripwire, its removal, the releases, the pin bump."""
