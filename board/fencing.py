"""Fenced downstream writes: a Django model row that a superseded lease holder cannot overwrite.

`FencedWriter(model, key_field, fence_field).write(key, fence, **values)` accepts a write only when
its fence is at least the stored one, in one atomic statement, and raises `StaleFence` otherwise.
It depends only on Django's ORM: the model is the caller's. Why, and the same statement for any
SQL table: docs/fencing.md.
"""
from __future__ import annotations

from typing import Any

from django.db import IntegrityError, models, transaction

__all__ = ["FencedWriter", "StaleFence"]

# How many times a write goes round UPDATE -> INSERT. A second lap follows another writer's first
# insert of the key; a third needs someone deleting the row meanwhile. This bounds work.
_ATTEMPTS = 10


class StaleFence(Exception):
    """A write whose fence is below the last one the row accepted: its writer has been
    superseded (another holder took the task over). Nothing was written."""

    def __init__(self, key: Any, fence: int, stored_fence: int):
        self.key = key
        self.fence = fence
        self.stored_fence = stored_fence
        super().__init__(f"stale fence for {key!r}: this write has fence {fence}, "
                         f"the row already holds fence {stored_fence} (a newer holder wrote it)")


class FencedWriter:
    """Writes rows of `model` keyed by `key_field`, each guarded by the integer `fence_field`.

    ``FencedWriter(Report, key_field="task_id", fence_field="fence").write(task_id, lease.fence,
    summary=..., status=...)``

    The contract of `write(key, fence, **values)`:

    - It sets `values` and ``fence_field = fence`` on the row of `key` only when the row's stored
      fence is <= `fence`, in one conditional UPDATE (``... WHERE key = %s AND fence <= %s``):
      the comparison and the write are one atomic statement of the database, so no other
      writer can come between them.
    - An equal fence is the same holder writing again (a retry, a second checkpoint): accepted.
    - A lower fence raises `StaleFence` (with the key, the writer's fence and the stored one)
      and changes nothing.
    - The first write for a key inserts the row. Two first writes racing: one insert wins, the
      other's fails on the key's unique constraint, inside a savepoint so that the caller's
      transaction goes on; it then does the conditional UPDATE against the winner's row, which
      it overwrites or loses to exactly as if the winner had been there before.
    - Returns "inserted" or "updated".

    The model needs `key_field` unique (the primary key or ``unique=True``: without it two first
    writes would both insert) and `fence_field` an integer field. The writer never deletes; a
    row deleted by someone else is inserted again by the next write, which forgets the fences
    seen before it (delete only keys whose tasks are over).

    It works in autocommit and inside the caller's transaction (e.g. to write the row and
    other rows together): on PostgreSQL the conditional UPDATE then holds the row's lock until
    that transaction ends, and a concurrent writer of the same key waits for it and compares
    with what it committed.
    """

    def __init__(self, model: type[models.Model], *, key_field: str = "key", fence_field: str = "fence",
                 using: str = "default"):
        key = model._meta.get_field(key_field)
        if not (key.primary_key or key.unique):
            raise ValueError(f"{model.__name__}.{key_field} must be unique (primary_key=True or unique=True): "
                             "otherwise two first writes of a key would both insert a row")
        fence = model._meta.get_field(fence_field)
        if not isinstance(fence, models.IntegerField):  # BigIntegerField, PositiveIntegerField... too
            raise TypeError(f"{model.__name__}.{fence_field} must be an integer field")
        self.model = model
        self.key_field = key.name
        self.fence_field = fence.name
        self.using = using

    def write(self, key: Any, fence: int, /, **values: Any) -> str:
        if isinstance(fence, bool) or not isinstance(fence, int):
            raise TypeError(f"fence must be an integer (a lease's fence), not {fence!r}")
        if fence < 0:
            raise ValueError(f"fence must not be negative (a lease's fence starts at 1), not {fence}")
        for name in (self.key_field, self.fence_field):
            if name in values:
                raise ValueError(f"{name} is set by the writer, not passed in values")
        rows = self.model._default_manager.db_manager(self.using)
        this_key = rows.filter(**{self.key_field: key})
        for _ in range(_ATTEMPTS):
            # The one conditional UPDATE: the stored fence is compared and replaced in the same
            # statement (PostgreSQL re-checks the WHERE against a row a concurrent UPDATE changed).
            if this_key.filter(**{f"{self.fence_field}__lte": fence}).update(**values, **{self.fence_field: fence}):
                return "updated"
            stored = this_key.values_list(self.fence_field, flat=True).first()
            if stored is not None:
                if stored > fence:  # fences only rise: this writer has been superseded for good
                    raise StaleFence(key, fence, stored)
                continue  # a first write of this key landed just after our UPDATE: compare with it
            try:
                # A savepoint: a lost insert leaves the caller's transaction usable.
                with transaction.atomic(using=self.using):
                    rows.create(**values, **{self.key_field: key, self.fence_field: fence})
                return "inserted"
            except IntegrityError:
                if not this_key.exists():
                    raise  # not a lost race for this key: the values break another constraint
                # Another first write of this key inserted between our UPDATE and INSERT: go
                # round, the UPDATE now meets its row.
        raise RuntimeError(f"{self.model.__name__} {key!r}: the row kept appearing and disappearing "
                           f"over {_ATTEMPTS} attempts (is something deleting it?)")
