"""Take back expired leases, apply the tasks' deadlines, admit unblocked tasks and fire due schedules
(board.engine.schedules: each tick's task once, whichever reapers run). `manage.py serve` (so `make run`) starts
it with --loop and restarts it if it dies; each pass is recorded for /healthz (board/health.py).
With --loop it also prunes the history every TASKFLOW["PRUNE_INTERVAL_SECONDS"] (board.engine.retention),
in a thread of its own: a prune of a big board takes many batches, and lost leases must keep
coming back every second meanwhile. With --loop it also runs the webhook passes (board/webhooks/:
collect the history's alerts, send the due deliveries) every --interval seconds in another thread:
a receiver that times out must not hold up the leases either. And it runs the bulk jobs (board/bulk/)
that no server thread took, or whose runner went quiet (a crashed process), in a third thread: a
50,000-task job takes minutes."""
import logging
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import DatabaseError, connections
from django.utils import timezone

from board import health
from board.engine import retention, schedules, transitions
from board.bulk import jobs as bulk_jobs
from board.webhooks import outbox as webhook_outbox
from board.webhooks import sending as webhook_sending
from server import tracing

log = logging.getLogger("board.reaper")


class Command(BaseCommand):
    help = (
        "Return expired leases to QUEUED (or FAILED when attempts are spent), apply the tasks' "
        "deadlines (queue, attempt and progress timeouts), admit PENDING tasks whose dependencies "
        "have completed, and create the tasks of due schedules. Once, or every --interval seconds with --loop."
    )

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true", help="keep running")
        parser.add_argument(
            "--interval", type=float, default=settings.TASKFLOW["REAP_INTERVAL_SECONDS"],
            help="seconds between passes with --loop (default: %(default)s)",
        )
        parser.add_argument(
            "--prune-interval", type=float, default=settings.TASKFLOW["PRUNE_INTERVAL_SECONDS"],
            help="with --loop: seconds between prunes of the history, the first at start; 0: never "
                 "(default: %(default)s)",
        )
        parser.add_argument("--database", default="default")

    def handle(self, *args, loop=False, interval=1.0, database="default", prune_interval=0.0, **options):
        tracing.setup_from_environment("reaper")  # a span per lease taken back (OTEL_EXPORTER_OTLP_ENDPOINT)
        self.started_at = timezone.now()
        self.passes = 0
        if loop and prune_interval > 0:
            threading.Thread(target=self.prune_every, args=(prune_interval, database), name="prune",
                             daemon=True).start()
        if loop:
            threading.Thread(target=self.deliver_webhooks_every, args=(interval, database), name="webhooks",
                             daemon=True).start()
            threading.Thread(target=self.run_bulk_jobs_every, args=(interval, database), name="bulk",
                             daemon=True).start()
        while True:
            try:
                self.reap_once(database)
            except DatabaseError as exc:
                if not loop:
                    raise
                # A loop outlives a database restart: report and try again next pass.
                log.warning("reaper pass failed: %s", exc)
                connections[database].close()
            if not loop:
                return
            time.sleep(interval)

    def reap_once(self, database: str) -> None:
        reclaimed = transitions.reclaim_expired(using=database)
        for moved in reclaimed:
            self.stdout.write(f"reclaimed {moved.task_id} -> {moved.to_stage}")
        # Deadlines beside the lease (board.engine.deadlines): a task QUEUED too long fails, an
        # attempt over its time or without progress loses its lease.
        for moved in transitions.enforce_deadlines(using=database):
            self.stdout.write(f"{moved.reason}: {moved.task_id} -> {moved.to_stage}")
        # Approvals unanswered past their timeout (board.engine.approvals): their on_timeout.
        for task_id, stage in transitions.time_out_approvals(using=database):
            self.stdout.write(f"approval timed out: {task_id} -> {stage}")
        admitted = transitions.admit_ready(using=database)
        for task_id in admitted:
            self.stdout.write(f"admitted {task_id}")
        for fired in schedules.fire_due(using=database):
            if fired.error is not None:
                self.stdout.write(f"schedule {fired.schedule} not fired: {fired.error}")
                continue
            skipped = f" ({fired.skipped} missed ticks skipped)" if fired.skipped else ""
            made = "created" if fired.created else "already existed"
            self.stdout.write(f"fired {fired.schedule} {fired.tick:%Y-%m-%dT%H:%MZ} -> {fired.task_id} {made}{skipped}")
        self.stdout.flush()
        self.passes += 1
        health.record_reaper_pass(started_at=self.started_at, passes=self.passes, reclaimed=len(reclaimed),
                                  admitted=len(admitted), using=database)

    def prune_every(self, interval: float, database: str) -> None:
        """Prune now and then every `interval` seconds, with the default windows, logging the
        report's lines when it pruned something (a prune that found nothing says nothing: `make
        run`'s screen keeps its banner). A failed prune is logged and tried again at the next interval: what it
        committed stays (each batch is a transaction of its own)."""
        while True:
            try:
                report = retention.prune(using=database)
                if report.pruned_anything:
                    for line in report.lines():
                        log.info("prune: %s", line)
            except Exception:  # the reaper's thread must outlive any one failure
                log.exception("prune failed")
            finally:
                connections[database].close()  # this thread's own connection
            time.sleep(interval)

    def deliver_webhooks_every(self, interval: float, database: str) -> None:
        """The webhook passes (board.webhooks): collect every `interval` seconds (check()'s problems
        every PROBLEMS_EVERY_SECONDS), then send what is due. A failed pass is logged and tried
        again: the deliveries are rows, so nothing is lost meanwhile."""
        problems_at = 0.0
        while True:
            try:
                problems = time.monotonic() - problems_at >= webhook_outbox.PROBLEMS_EVERY_SECONDS
                webhook_outbox.collect(problems=problems, using=database)
                if problems:
                    problems_at = time.monotonic()
                for sent in webhook_sending.send_due(using=database):
                    if sent.error:
                        log.info("webhook delivery %s attempt %s: %s", sent.delivery, sent.attempt, sent.error)
            except Exception:  # the reaper's thread must outlive any one failure
                log.exception("webhook pass failed")
                connections[database].close()
            time.sleep(interval)

    def run_bulk_jobs_every(self, interval: float, database: str) -> None:
        """Bulk jobs (board.bulk.jobs.run_due) every `interval` seconds: a pending job the server's
        own thread did not take (it died first), or a running one whose runner stopped writing its
        heartbeat; each goes on from its last progress. A failed pass is logged and tried again."""
        while True:
            try:
                for job_id in bulk_jobs.run_due(using=database):
                    log.info("bulk job %s run by the reaper", job_id)
            except Exception:  # the reaper's thread must outlive any one failure
                log.exception("bulk job pass failed")
            finally:
                connections[database].close()
            time.sleep(interval)
