"""A racer process for the cross-process claim test: it sets Django up on the database named by
DATABASE_URL, then claims one task per round, all racers released together by a barrier."""
import os


def race(index: int, database_url: str, rounds: int, barrier, results) -> None:
    os.environ.update(DJANGO_SETTINGS_MODULE="taskflow_site.settings", DATABASE_URL=database_url, DEBUG="1")
    import django

    django.setup()
    from django.db import connection

    from board import errors, transitions

    connection.ensure_connection()
    for n in range(rounds):
        barrier.wait(timeout=60)
        try:
            transitions.claim(f"proc-{n}", f"process-{index}", 60)
            results.put((n, index, "won", ""))
        except errors.Taken:
            results.put((n, index, "taken", ""))
        except BaseException as exc:  # reported as a fault, never as a loser
            results.put((n, index, "fault", repr(exc)))
    connection.close()
