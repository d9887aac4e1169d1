"""A racer process for the cross-process races: it sets Django up on the database named by
DATABASE_URL, then, all racers released together by a barrier each round, claims the round's
task (`verb` "claim"), creates a task with the round's id ("create"), or mints a key for the
round's agent name ("mint": one live key per name, board.agent_keys)."""
import os


def race(index: int, database_url: str, rounds: int, barrier, results, verb: str = "claim") -> None:
    os.environ.update(DJANGO_SETTINGS_MODULE="taskflow_site.settings", DATABASE_URL=database_url, DEBUG="1")
    import django

    django.setup()
    from django.db import connection

    from board import agent_keys
    from board.engine import errors, transitions
    from board.engine.transitions import TaskSpec

    connection.ensure_connection()
    for n in range(rounds):
        barrier.wait(timeout=60)
        try:
            if verb == "mint":
                agent_keys.create_key(f"minted-{n}")
            elif verb == "create":
                transitions.create(TaskSpec(id=f"new-{n}", title=f"by process {index}"))
            else:
                transitions.claim(f"proc-{n}", f"process-{index}", 60)
            results.put((n, index, "won", ""))
        except (errors.Taken, errors.DuplicateId, agent_keys.NameHasLiveKey):
            results.put((n, index, "taken", ""))
        except BaseException as exc:  # reported as a fault, never as a loser
            results.put((n, index, "fault", repr(exc)))
    connection.close()
