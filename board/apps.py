from django.apps import AppConfig


class BoardConfig(AppConfig):
    name = "board"
    verbose_name = "TaskFlow board"
    # settings.DEFAULT_AUTO_FIELD: BigAutoField on SQL stores, ObjectIdAutoField on MongoDB.

    def ready(self) -> None:
        # The engine announces commits (board.engine.commits) without knowing who listens; the
        # live board listens: it wakes this process's outbox tailer and rings the others.
        from board.engine import commits
        from board.live.doorbell import announce_commit

        commits.subscribe(announce_commit)
        # The engine tells what became of each move (board.engine.outcomes); the metrics count it.
        from board import metrics
        from board.engine import outcomes

        outcomes.subscribe(metrics.on_outcome)
        # ...and times SQLite's writers (board.engine.stores.sqlite).
        from board.engine.stores.sqlite import observe_sqlite_writes

        observe_sqlite_writes(metrics.on_sqlite_write)
        # A pooled PostgreSQL connection is checked before it is handed out without a round
        # trip unless the server sent it something (board/engine/stores/pg_pool.py).
        from django.db.backends.signals import connection_created

        from board.engine.stores.pg_pool import use_quiet_check

        connection_created.connect(use_quiet_check, dispatch_uid="taskflow-pool-check")
