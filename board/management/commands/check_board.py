"""Print the board's invariant problems; exit 1 when there are any."""
import sys

from django.core.management.base import BaseCommand

from board.engine import selectors


class Command(BaseCommand):
    help = "Run check() over the board and print each problem as: task  code  text."

    def add_arguments(self, parser):
        parser.add_argument("--database", default="default")

    def handle(self, *args, database="default", **options):
        problems = selectors.problems(using=database)
        for p in problems:
            self.stdout.write(f"{p.task}\t{p.code}\t{p.text}")
        if problems:
            self.stderr.write(f"{len(problems)} problem(s)")
            sys.exit(1)
        self.stdout.write("no problems")
