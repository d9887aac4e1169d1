"""Shared test plumbing: which real services are here, and what to do when one is missing.

A test that needs a missing service fails in CI (CI=true) and, on a laptop, is skipped with a
line at the end of the run that names exactly what did not run.

It also marks the tests that `make test-fast` leaves out (pytest.ini's `browser`, `server`,
`slow`): a test is `server` (or `browser`) when its code, its fixtures or the tests' helpers they
call start the board's real server (or Chromium), found at collection, so that a new test is
marked without anyone remembering to; a test that starts the server unmarked anyway (e.g. through
a name built at run time) fails and says so."""
import inspect
import types
import warnings

import pytest
from django.conf import settings
from django.db import OperationalError
from django.db.backends.postgresql.operations import DatabaseOperations as PostgresOperations

from harness.board_server import BoardServer
from harness.browser import browser_missing, launch_chromium, proxy_missing
from tests.live_server import server_for_sessions
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


# What a test calls that makes it `server` / `browser`: the one server launcher and its wrapper,
# the one Chromium launcher (by name too: a function may import them locally).
LAUNCHERS = {"server": (BoardServer, server_for_sessions), "browser": (launch_chromium,)}


def _reaches(item: pytest.Function, targets: tuple) -> bool:
    """Whether the test or one of its fixtures names one of `targets`, directly or through the
    functions of tests/ and harness/ it calls, or a fixture it asks for by a literal name
    (`request.getfixturevalue("sqlite_server")`)."""
    names = {target.__name__ for target in targets}
    manager = item.session._fixturemanager
    seen: set = set()

    def fixture_functions(defs) -> list:
        return [defs[-1].func] if defs else []

    def reaches(function) -> bool:
        function = inspect.unwrap(getattr(function, "__func__", function))
        return isinstance(function, types.FunctionType) and walk(function.__code__, function.__globals__)

    def walk(code: types.CodeType, namespace: dict) -> bool:
        if code in seen:
            return False
        seen.add(code)
        for name in code.co_names:
            found = namespace.get(name)
            if name in names or any(found is target for target in targets):
                return True
            if (isinstance(found, types.FunctionType) and found.__module__.split(".")[0] in ("tests", "harness")
                    and reaches(found)):
                return True
        for const in code.co_consts:
            if isinstance(const, types.CodeType) and walk(const, namespace):
                return True
            if (isinstance(const, str) and "getfixturevalue" in code.co_names
                    and any(reaches(f) for f in fixture_functions(manager.getfixturedefs(const, item)))):
                return True
        return False

    used = [f for defs in item._fixtureinfo.name2fixturedefs.values() for f in fixture_functions(defs)]
    return any(reaches(function) for function in [item.function, *used])


# The tests that take many seconds with neither a server nor a browser (long races with threads
# and processes, big boards, commands in other processes), by file and function name (every
# store's subclass, every parameter): `slow`, left out of `make test-fast`. Measured with
# `--durations` on this machine kind (2 shared cores, heavily loaded): 5 s or more there.
SLOW = {
    "test_contract.py": {
        "test_two_dependencies_completing_at_once_always_admit_the_dependent",
        "test_16_copies_of_one_claim_make_one_lease_over_100_rounds",
        "test_reaper_takes_back_a_lease_renewed_meanwhile_only_if_still_expired",
        "test_exactly_one_of_16_concurrent_claimers_wins_over_200_rounds",
        "test_exactly_one_of_16_submitters_of_one_token_succeeds_over_200_rounds",
        "test_exactly_one_of_8_racing_processes_wins_over_100_rounds",
        "test_a_task_created_while_its_dependency_completes_is_admitted",
        "test_concurrent_claim_next_never_hands_out_a_task_twice",
        "test_16_claimers_never_run_more_than_the_queue_limit_over_200_rounds",
        "test_16_claimers_never_run_two_tasks_of_one_concurrency_key_over_200_rounds",
        "test_a_limit_set_while_claims_and_completes_run_starts_an_exact_count_over_100_rounds",
        "test_16_creators_of_one_dedup_key_make_one_task_over_200_rounds",
        "test_16_claimers_take_exactly_the_rates_one_claim_per_window_over_200_rounds",
        "test_16_threads_creating_and_claiming_two_plans_lose_no_task_over_200_rounds",
        "test_16_claimers_of_two_queues_take_exactly_one_claim_of_a_rate_key_per_interval_over_200_rounds",
        "test_a_pause_racing_claims_lets_none_start_after_it_over_100_rounds",
    },
    "test_fencing.py": {
        "test_the_psycopg_recipe_refuses_the_superseded_holder_over_200_rounds",
        "test_the_sqlite3_recipe_refuses_the_superseded_holder_over_200_rounds",
        "test_two_holders_write_at_once_and_only_the_current_one_survives_200_rounds",
    },
    "test_deadlines.py": {
        "test_the_deadline_pass_racing_the_holders_complete_has_exactly_one_winner",
        "test_a_heartbeat_racing_the_progress_deadline_never_saves_the_lease",
    },
    "test_key_scopes.py": {"test_scoped_claimers_racing_take_only_their_queues_each_once"},
    "test_key_names.py": {"test_concurrent_mints_for_one_name_make_exactly_one_key"},
    "test_admin.py": {
        "test_two_operators_saving_the_same_version_exactly_one_wins",
        "test_force_release_races_a_complete",
        "test_release_stale_races_a_renew",
        "test_an_edit_racing_a_claim",
        "test_a_bulk_cancel_of_hundreds_of_tasks_gives_one_summary_with_exact_counts",
    },
    "test_consumers.py": {"test_a_large_board_arrives_in_parts_each_under_daphnes_frame_limit"},
    "test_checkpoints.py": {"test_commits_past_sqlites_own_threshold_leave_the_database_file_untouched"},
    "test_scale_reads.py": {
        "test_check_holds_no_row_per_task_and_finds_what_the_full_snapshot_finds",
        "test_a_snapshot_holds_its_frames_and_one_part_of_the_board_at_a_time",
    },
    "test_pg_statistics.py": {"test_the_claim_reads_the_index_with_stale_statistics_and_with_current_ones"},
    "test_bench_imports.py": {"test_api_cost_splits_a_request_without_the_test_install"},
    "test_api_schema.py": {"test_the_command_writes_and_checks_a_schema_file"},
    "test_readme.py": {"test_each_readme_manage_command_runs_as_written"},
    "test_live_card_reads.py": {
        "test_the_changes_read_selects_the_card_columns_only",
        "test_the_snapshot_read_selects_the_card_columns_only",
    },
    "test_limits_json_depth.py": {"test_the_body_parser_reads_any_depth"},
    "test_redis_layer.py": {"test_a_commit_in_another_process_wakes_this_processs_tailer_through_redis"},
    "test_settings.py": {
        "test_production_settings_pass_check_deploy",
        "test_production_settings_on_mongodb_pass_check_deploy",
    },
    "test_outbox.py": {"test_concurrent_writers_every_event_read_exactly_once"},
    "test_tracing.py": {
        "test_without_the_variable_no_opentelemetry_module_is_loaded",
        "test_the_reaper_exports_a_span_per_lease_it_takes_back_and_nothing_else",
    },
    "test_commands.py": {
        "test_demo_agents_leave_other_queues_alone",
        "test_a_command_cannot_store_what_the_api_refuses",
        "test_reaper_process_returns_an_expired_lease_within_ttl_plus_5_seconds",
        "test_demo_runs_its_plan_to_the_end_with_a_clean_board",
    },
}


# The tests that run the real server without BoardServer (what `make run` itself starts, or a
# benchmark's own server process): `server`, like those found by _reaches().
SERVER = {
    "test_first_run.py": {"test_make_run_ends_with_one_banner_whose_password_logs_in"},
    "test_readme.py": {"test_the_readme_agent_block_runs_as_written_against_the_server"},
    "test_bench_imports.py": {"test_http_claims_runs_a_real_server_without_the_test_install"},
}
BY_NAME = {"slow": SLOW, "server": SERVER}


def _stale_names(items) -> None:
    """A name in SLOW or SERVER that its file no longer defines (renamed?) is reported."""
    modules = {item.path.name: item.module for item in items if isinstance(item, pytest.Function)}
    for table_name, table in (("SLOW", SLOW), ("SERVER", SERVER)):
        for filename, names in table.items():
            if (module := modules.get(filename)) is not None:
                defined = {name for value in vars(module).values() for name in dir(value)} | set(vars(module))
                for name in sorted(names - defined):
                    warnings.warn(pytest.PytestWarning(f"tests/conftest.py {table_name} names {filename}::{name}, "
                                                       "which that file no longer defines"), stacklevel=1)


def pytest_collection_modifyitems(items) -> None:
    _stale_names(items)
    for item in items:
        # In the MongoDB session every test needs the MongoDB server (it is the default database).
        if ON_MONGODB:
            item.add_marker(pytest.mark.mongodb)
        if not isinstance(item, pytest.Function):
            continue
        for marker, table in BY_NAME.items():
            if item.originalname in table.get(item.path.name, ()):
                item.add_marker(marker)
        for marker, targets in LAUNCHERS.items():
            if not item.get_closest_marker(marker) and _reaches(item, targets):
                item.add_marker(marker)


# The test running now (pytest_runtest_protocol), for the check in BoardServer.start below.
_running: list[pytest.Item] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


_start = BoardServer.start


def _start_if_marked(self, *args, **kwargs):
    if _running and not _running[-1].get_closest_marker("server"):
        pytest.fail(f"{_running[-1].nodeid} starts the board's server but is not marked `server` "
                    "(tests/conftest.py did not see it: add @pytest.mark.server), so "
                    "`make test-fast` would run it", pytrace=False)
    return _start(self, *args, **kwargs)


BoardServer.start = _start_if_marked


# The flush after a transactional test (one TRUNCATE of every table) can deadlock with a board
# server still reading (a REPEATABLE READ transaction of several queries); PostgreSQL then ends
# the TRUNCATE, and the next test would start on this one's rows. It is run again: the failed
# attempt rolled back whole (execute_sql_flush is atomic). tests/test_flush_beside_readers.py.
_execute_sql_flush = PostgresOperations.execute_sql_flush
FLUSH_ATTEMPTS = 5


def _execute_sql_flush_again_after_a_deadlock(self, sql_list):
    for attempt in range(1, FLUSH_ATTEMPTS + 1):
        try:
            return _execute_sql_flush(self, sql_list)
        except OperationalError as exc:
            if attempt == FLUSH_ATTEMPTS or getattr(exc.__cause__, "sqlstate", None) != "40P01":
                raise


PostgresOperations.execute_sql_flush = _execute_sql_flush_again_after_a_deadlock


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
