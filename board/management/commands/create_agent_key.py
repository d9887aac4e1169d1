"""Mint an API key for an agent and print it (the only time it is ever shown). Reserved names
(`system`, `system:…`, `admin`, any existing username) are refused: board.agent_keys.

One live key per agent name: a name that has a live key is refused (exit status 1) unless
`--rotate[=SECONDS]` is given, which makes the new key and ends the old one SECONDS from now
(0, at once, when no value is given; at most limits.MAX_ROTATION_GRACE).

`--queues ci-*,docs` limits the key to those queues (board.engine.scopes): it creates, lists,
reads, claims and acts only on their tasks; the others are absent to it.

`--capabilities gpu,python` says what the agent can do (board.engine.capabilities): its claims
take only tasks whose `requires` are all among them. The Keys admin can change them later."""
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from board import agent_keys
from board.engine import errors, limits


def _grace(value: str) -> timedelta:
    try:
        seconds = int(value)
    except ValueError:
        raise CommandError(f"--rotate takes a whole number of seconds, not {value!r}") from None
    return timedelta(seconds=seconds)


class Command(BaseCommand):
    help = "Create an API key for agent NAME and print it once. Agents send it as 'Authorization: Bearer <key>'."

    def add_arguments(self, parser):
        parser.add_argument("name", help="the agent name the key acts as (not system, system:..., admin "
                                         "or an existing username)")
        parser.add_argument("--operator", action="store_true", help="may also admit, requeue and cancel tasks")
        parser.add_argument("--rotate", nargs="?", const="0", default=None, metavar="SECONDS",
                            help="replace the name's live key: it is refused SECONDS from now (default 0: "
                                 f"at once; at most {int(limits.MAX_ROTATION_GRACE.total_seconds())})")
        parser.add_argument("--queues", default=None, metavar="PATTERNS",
                            help="limit the key to these queues: comma-separated glob patterns, e.g. 'ci-*,docs' "
                                 "(default: every queue)")
        parser.add_argument("--capabilities", default=None, metavar="LABELS",
                            help="what the agent can do: comma-separated labels, e.g. 'gpu,python,model:opus' "
                                 "(default: none; a task's `requires` must all be among them)")
        parser.add_argument("--database", default="default")

    def handle(self, *args, name, operator=False, rotate=None, queues=None, capabilities=None, database="default",
               **options):
        grace = _grace(rotate) if rotate is not None else None
        try:
            row, key = agent_keys.create_key(name, is_operator=operator, rotate=grace, queues=queues,
                                              capabilities=capabilities, using=database)
        except errors.InvalidRequest as exc:
            raise CommandError(exc.message) from None
        rotated = f"; the name's previous key ends in {int(grace.total_seconds())} s" if grace is not None else ""
        scoped = f", queues {row.queues}" if row.queues else ""
        scoped += f", capabilities {row.capabilities}" if row.capabilities else ""
        self.stderr.write(f"key {row.prefix}… for agent {row.name!r}{' (operator)' if operator else ''}{scoped}{rotated}; "
                          "store it now, it is not shown again:")
        self.stdout.write(key)
