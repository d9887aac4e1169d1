"""The run-time commands against a real database: the reaper as a separate process (as `make
run` starts it), check_board and contract_check."""
import subprocess
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from board.engine import transitions
from board.engine.transitions import TaskSpec
from board.models import Dependency, Task, TaskEvent
from harness.board_server import LineReader, stop_process
from tests import live_server
from tests.support import database_url, db_state, sqlite_db_mark

pytestmark = sqlite_db_mark()


def manage(*args: str, **popen) -> subprocess.Popen:
    """A management command as another process on the test database."""
    url = database_url(connections["default"].settings_dict)
    return live_server.manage(url, settings.SECRET_KEY, *args, **popen)


def test_reaper_process_returns_an_expired_lease_within_ttl_plus_5_seconds():
    transitions.create(TaskSpec(id="crashy", title="its agent dies"))
    ttl = 2
    claimed = transitions.claim("crashy", "doomed-agent", ttl)
    reaper = manage("reap", "--loop", "--interval", "0.5", stdout=subprocess.PIPE, text=True)
    said = LineReader(reaper.stdout)
    lines: list[str | None] = []
    try:
        deadline = claimed.lease.expires_at + timedelta(seconds=5)
        # Waiting on another process: poll the row until the promised bound, then judge.
        while Task.objects.get(pk="crashy").stage == "RUNNING" and timezone.now() < deadline:
            time.sleep(0.1)
        task = Task.objects.get(pk="crashy")
        assert task.stage == "QUEUED", f"still {task.stage} 5 s after the lease expired"
        assert task.updated_at >= claimed.lease.expires_at  # not taken back while live
        # The reaper writes its line after its commit: wait for the line (bounded) before
        # stopping it. Stopped as soon as the row changed, a loaded machine could end it
        # between its commit and its write (the line was then missing, once, in a clean clone).
        while "reclaimed crashy -> QUEUED" not in lines and None not in lines:
            lines.append(said.next(timeout=10))
    finally:
        stop_process(reaper)
    assert "reclaimed crashy -> QUEUED" in lines, lines
    with pytest.raises(transitions.errors.LeaseLost):
        transitions.complete("crashy", claimed.lease.token, {"late": True})


def test_check_board_prints_problems_and_exits_non_zero(capsys):
    transitions.create([TaskSpec(id="a", title="a"), TaskSpec(id="b", title="b", deps=["a"])])
    call_command("check_board")
    assert "no problems" in capsys.readouterr().out
    Dependency.objects.create(task_id="a", depends_on_id="b")  # a cycle written behind its back
    with pytest.raises(SystemExit) as exited:
        call_command("check_board")
    assert exited.value.code == 1
    out = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[:2] for line in out] == [
        ["a", "dep_cycle"], ["a", "queued_blocked"], ["b", "dep_cycle"],
    ]


def test_contract_check_reports_one_winner_per_round(capsys):
    call_command("contract_check", "--rounds", "3", "--racers", "8")
    out = capsys.readouterr().out
    assert "concurrent_claim: 3 rounds x 8 racers, winners per round [1] -> ok" in out
    assert "duplicate_token_submit: 3 rounds x 8 racers, winners per round [1] -> ok" in out
    assert "check(): 0 problem(s)" in out
    assert Task.objects.exclude(stage__in=["COMPLETED", "CANCELLED"]).count() == 0


def test_first_run_creates_an_administrator_with_a_random_password_printed_once(capsys):
    from django.contrib.auth import authenticate, get_user_model

    call_command("ensure_admin")
    out = capsys.readouterr().out
    password = out.split("password ", 1)[1].split()[0]
    assert len(password) >= 12 and authenticate(username="admin", password=password) is not None
    call_command("ensure_admin")  # a second run changes nothing and prints nothing
    assert capsys.readouterr().out == "" and get_user_model().objects.count() == 1


def test_first_run_takes_djangos_superuser_variables(capsys, monkeypatch):
    from django.contrib.auth import authenticate

    monkeypatch.setenv("DJANGO_SUPERUSER_USERNAME", "ops")
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "a-long-chosen-passphrase")
    call_command("ensure_admin")
    assert "from DJANGO_SUPERUSER_*" in capsys.readouterr().out
    assert authenticate(username="ops", password="a-long-chosen-passphrase").is_superuser


def test_demo_runs_its_plan_to_the_end_with_a_clean_board(capsys, settings):
    """At --speed 25 (the default is slow enough to watch): every scripted event happens, every
    task ends COMPLETED, and the board has no problem."""
    settings.TASKFLOW = {**settings.TASKFLOW, "RETRY_BACKOFF_BASE_SECONDS": 0.05, "RETRY_BACKOFF_MAX_SECONDS": 0.2}
    call_command("demo", "--speed", "25", "--seed", "7", "--agents", "4")
    out = capsys.readouterr().out
    assert "tasks completed" in out and "27 of 27 tasks completed" in out, out
    assert "check(): 0 problem(s)" in out, out
    [run] = {task_id.split("-")[1] for task_id in Task.objects.values_list("pk", flat=True)}
    assert set(Task.objects.values_list("stage", flat=True)) == {"COMPLETED"}
    verbs = set(TaskEvent.objects.values_list("verb", flat=True))
    # claimed, renewed, completed; a failure retried by the engine, one requeued by the
    # operator, a pause resumed, the held approval admitted
    assert {"claim", "renew", "complete", "fail", "retry", "requeue", "pause", "resume", "admit"} <= verbs
    assert TaskEvent.objects.get(task_id=f"demo-{run}-fetch-mail", verb="retry").actor == "system"
    assert TaskEvent.objects.get(task_id=f"demo-{run}-check-chat", verb="requeue").actor == "demo-operator"
    assert TaskEvent.objects.get(task_id=f"demo-{run}-parse-wiki", verb="pause")
    assert TaskEvent.objects.get(task_id=f"demo-{run}-approve", verb="admit").actor == "demo-operator"
    from board.engine import selectors

    assert selectors.problems() == []


def test_demo_agents_leave_other_queues_alone(capsys, settings):
    settings.TASKFLOW = {**settings.TASKFLOW, "RETRY_BACKOFF_BASE_SECONDS": 0.05, "RETRY_BACKOFF_MAX_SECONDS": 0.2}
    transitions.create(transitions.TaskSpec(id="real-work", title="not the demo's", queue="default"))
    call_command("demo", "--speed", "25", "--seed", "3", "--agents", "2")
    assert "27 of 27 tasks completed" in capsys.readouterr().out
    assert list(TaskEvent.objects.filter(task_id="real-work").values_list("verb", flat=True)) == ["create"]
    assert Task.objects.get(pk="real-work").stage == "QUEUED"


# What an operator's script run as a command sends (`manage.py shell -c`, another process, the
# engine called directly as every management command calls it): each over one of the caps.
OVER_THE_CAPS = """
from board.engine import errors, transitions
from board.engine.limits import MAX_JSON_FIELD_BYTES, MAX_REASON_CHARS, MAX_DESCRIPTION_CHARS
big = "x" * (MAX_JSON_FIELD_BYTES + 1)
calls = {
    "create": lambda: transitions.create(transitions.TaskSpec(title="t", payload=big)),
    "edit": lambda: transitions.edit("q", actor="ops", version=0, description="d" * (MAX_DESCRIPTION_CHARS + 1)),
    "complete": lambda: transitions.complete("r", TOKEN, [big]),
    "renew": lambda: transitions.renew("r", TOKEN, 60, checkpoint=big),
    "cancel": lambda: transitions.cancel("q", actor="ops", reason="r" * (MAX_REASON_CHARS + 1)),
}
for name, call in calls.items():
    try:
        call()
    except errors.BoardError as refused:
        print(name, refused.code, refused.field)
    else:
        print(name, "accepted")
"""


def test_a_command_cannot_store_what_the_api_refuses():
    transitions.create([TaskSpec(id="q", title="queued"), TaskSpec(id="r", title="running")])
    token = transitions.claim("r", "agent-1", 600).lease.token
    before = db_state()
    script = manage("shell", "--no-imports", "-c", OVER_THE_CAPS.replace("TOKEN", repr(token)),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = script.communicate(timeout=120)
    assert script.returncode == 0, err
    assert out.splitlines() == [
        "create too_large payload",
        "edit validation_error description",
        "complete too_large result",
        "renew too_large checkpoint",
        "cancel validation_error reason",
    ]
    assert db_state() == before


def test_serve_refuses_a_pool_smaller_than_what_a_process_holds():
    """Request threads + the background threads that use the database (asgiref's, the snapshot
    builder, the health checker, one spare): a smaller pool would make a request wait 5 s."""
    from django.core.management.base import CommandError

    from board.management.commands.serve import BACKGROUND_CONNECTIONS, Command

    assert BACKGROUND_CONNECTIONS == 4
    with pytest.raises(CommandError, match=r"\(6: TASKFLOW_HTTP_THREADS \+ 4\)"):
        Command.check_pool({"max_size": 5}, threads=2)
    Command.check_pool({"max_size": 6}, threads=2)
    Command.check_pool(True, threads=2)  # a pool of the driver's default size: not checked


def test_a_reaper_pass_fires_a_due_schedule_once_and_says_so():
    """A schedule whose tick is 10 minutes past (the row aged, as after downtime): one pass of the
    reaper process creates the latest tick's task and reports it with the skipped ticks; a second
    pass fires nothing."""
    from board.engine import schedules
    from board.models import Schedule

    schedules.create_schedule("every-minute", cron="* * * * *", task={"title": "tick"})
    ten_ago = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=10)
    Schedule.objects.filter(pk="every-minute").update(next_tick_at=ten_ago)
    first = manage("reap", stdout=subprocess.PIPE, text=True)
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 0
    row = Schedule.objects.get(pk="every-minute")
    assert row.last_tick_at > ten_ago and row.skipped_ticks >= 9 and row.next_tick_at > row.last_tick_at
    assert (f"fired every-minute {row.last_tick_at:%Y-%m-%dT%H:%MZ} -> {row.last_task_id} created "
            f"({row.skipped_ticks} missed ticks skipped)") in out
    assert list(Task.objects.values_list("id", flat=True)) == [row.last_task_id]
    again = manage("reap", stdout=subprocess.PIPE, text=True)
    out, _ = again.communicate(timeout=60)
    later = Schedule.objects.get(pk="every-minute")
    if later.last_tick_at == row.last_tick_at:
        assert "fired" not in out and Task.objects.count() == 1
    else:  # a new minute began between the two passes: its own tick fired, once, nothing skipped
        assert (later.last_tick_at, later.skipped_ticks, Task.objects.count()) == (
            row.next_tick_at, row.skipped_ticks, 2)
