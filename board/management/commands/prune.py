"""Delete old terminal tasks and collapse old heartbeats (board.engine.retention decides what may
go). The reaper does the same on a schedule (TASKFLOW_PRUNE_INTERVAL; docs/retention.md)."""
import re
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from board.engine import retention

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> timedelta:
    """'30d', '24h', '90m', '3600s' or plain seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (e.g. 30d, 24h, 90m, 3600s)")
    return timedelta(seconds=float(match[1]) * _UNITS[match[2] or "s"])


class Command(BaseCommand):
    help = (
        "Delete terminal tasks (COMPLETED, CANCELLED, FAILED with no attempt left) untouched for "
        "--terminal-after, with their history and dependency rows, unless a task that stays depends "
        "on them; collapse the renew rows older than --renews-after into the last one of each lease. "
        "--dry-run prints what would go and writes nothing."
    )

    def add_arguments(self, parser):
        renews, terminal = retention.default_windows()
        parser.add_argument("--dry-run", action="store_true", help="count what would go; write nothing")
        parser.add_argument("--renews-after", type=duration, default=renews,
                            help=f"collapse renews older than this (default: {renews}; e.g. 24h)")
        parser.add_argument("--terminal-after", type=duration, default=terminal,
                            help=f"delete terminal tasks untouched for this long (default: {terminal}; e.g. 30d)")
        parser.add_argument("--database", default="default")

    def handle(self, *args, dry_run=False, renews_after=None, terminal_after=None, database="default", **options):
        try:
            report = retention.prune(renews_after=renews_after, terminal_after=terminal_after, dry_run=dry_run,
                                     using=database)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        for line in report.lines():
            self.stdout.write(line)
