"""A test-only Django app: a downstream table written through board.fencing.FencedWriter
(tests/test_fencing.py). Installed by tests/settings.py only; never part of the product."""
