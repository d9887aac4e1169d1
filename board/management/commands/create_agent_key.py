"""Mint an API key for an agent and print it (the only time it is ever shown). Reserved names
(`system`, `system:…`, `admin`, any existing username) are refused: board.agent_keys."""
from django.core.management.base import BaseCommand, CommandError

from board import agent_keys
from board.engine import errors


class Command(BaseCommand):
    help = "Create an API key for agent NAME and print it once. Agents send it as 'Authorization: Bearer <key>'."

    def add_arguments(self, parser):
        parser.add_argument("name", help="the agent name the key acts as (not system, system:..., admin "
                                         "or an existing username)")
        parser.add_argument("--operator", action="store_true", help="may also admit, requeue and cancel tasks")
        parser.add_argument("--database", default="default")

    def handle(self, *args, name, operator=False, database="default", **options):
        try:
            row, key = agent_keys.create_key(name, is_operator=operator, using=database)
        except errors.InvalidRequest as exc:
            raise CommandError(exc.message) from None
        self.stderr.write(f"key {row.prefix}… for agent {row.name!r}{' (operator)' if operator else ''}; "
                          "store it now, it is not shown again:")
        self.stdout.write(key)
