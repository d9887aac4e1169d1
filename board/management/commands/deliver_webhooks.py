"""One webhook pass (board/webhooks/): collect the history's events and check()'s new problems
into each webhook's deliveries, then send what is due, printing each attempt. The reaper's loop
(`manage.py reap --loop`, which `manage.py serve` starts) does this every second by itself."""
from django.core.management.base import BaseCommand

from board.webhooks import sending


class Command(BaseCommand):
    help = "Collect webhook events and send the deliveries that are due, once (docs/webhooks.md)."

    def add_arguments(self, parser):
        parser.add_argument("--database", default="default")

    def handle(self, *args, database="default", **options):
        for sent in sending.deliver(using=database):
            status = f"HTTP {sent.status}" if sent.status is not None else "no answer"
            error = f": {sent.error}" if sent.error else ""
            self.stdout.write(f"delivery {sent.delivery} attempt {sent.attempt}: {sent.state} ({status}){error}")
