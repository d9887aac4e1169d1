"""The server's settings (taskflow_site.settings) in a process whose clock is wrong: every
`django.utils.timezone.now()` is off by TASKFLOW_TEST_CLOCK_SKEW_SECONDS (e.g. 3600: an hour
ahead). Test-only: tests/test_ops_clock.py starts `manage.py serve` and `manage.py reap` with
DJANGO_SETTINGS_MODULE=tests.skewed_clock_settings, as a host whose clock has drifted."""
import os
from datetime import timedelta

from django.utils import timezone

from taskflow_site.settings import *  # noqa: F401,F403

CLOCK_SKEW = timedelta(seconds=float(os.environ["TASKFLOW_TEST_CLOCK_SKEW_SECONDS"]))
_true_now = timezone.now


def _skewed_now():
    return _true_now() + CLOCK_SKEW


# Patched on the module: the board's code calls timezone.now() through it.
timezone.now = _skewed_now
