"""Shared test plumbing: which real services are here, and what to do when one is missing.

A test that needs a missing service fails in CI (CI=true) and, on a laptop, is skipped with a
line at the end of the run that names exactly what did not run."""
import pytest
from django.conf import settings

from harness.browser import browser_missing, proxy_missing
from tests.services import IN_CI

# tests/mongodb runs in a session of its own, on MongoDB settings (make test: the second pytest
# run); the main session, on SQL stores, does not collect it.
ON_MONGODB = getattr(settings, "MONGODB_AVAILABLE", None) is not None
collect_ignore = [] if ON_MONGODB else ["mongodb"]


NOT_RUN = "NOT RUN: "


def _missing_service(item: pytest.Item, what: str, why: str) -> None:
    if IN_CI:
        pytest.fail(f"{what} is required in CI but {why}", pytrace=False)
    pytest.skip(f"{NOT_RUN}{what} ({why})")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("postgres") and not settings.POSTGRES_AVAILABLE:
        _missing_service(item, "PostgreSQL tests", f"no server answers at {settings.POSTGRES_URL}")
    if item.get_closest_marker("mongodb") and not getattr(settings, "MONGODB_AVAILABLE", False):
        _missing_service(item, "MongoDB tests", getattr(settings, "MONGODB_MISSING", "not the MongoDB session"))
    if item.get_closest_marker("redis") and not settings.REDIS_AVAILABLE:
        _missing_service(item, "Redis channel layer tests", f"no server answers at {settings.REDIS_TEST_URL}")
    if item.get_closest_marker("browser") and (why := browser_missing()):
        _missing_service(item, "browser tests", why)
    if item.get_closest_marker("proxy") and (why := proxy_missing()):
        _missing_service(item, "proxy tests", why)


def pytest_collection_modifyitems(items) -> None:
    # In the MongoDB session every test needs the MongoDB server (it is the default database).
    if ON_MONGODB:
        for item in items:
            item.add_marker(pytest.mark.mongodb)


def pytest_terminal_summary(terminalreporter) -> None:
    # Read from the skip reports, not from a list kept here: under pytest-xdist (make test) the
    # tests run in worker processes and only their reports reach this one.
    missing = set()
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        if reason.startswith(NOT_RUN):
            missing.add(reason)
    for line in sorted(missing):
        terminalreporter.write_line(line, yellow=True, bold=True)
