"""How the admin words times and leases. One lease helper (`LeaseState`) for every screen: the
change list's column, the force-release confirmation page and the actions' reports, judged by
the engine's rule (`lifecycle.lease_expired`), never by a rule of the admin's own."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.urls import reverse
from django.utils.http import urlencode

from board.engine.lifecycle import Stage, lease_expired
from board.models import Task


def span(seconds: float) -> str:
    """A short human duration: 45 s, 4 min, 2 h 5 min, 3 d 1 h."""
    s = int(abs(seconds))
    if s < 60:
        return f"{s} s"
    m = s // 60
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


@dataclass(frozen=True)
class LeaseState:
    """A lease expiring at `expires_at` (None: no lease), as it stands at `now` (the store's
    clock, as the reaper judges it)."""

    expires_at: datetime | None
    now: datetime

    @property
    def expired(self) -> bool:
        return lease_expired(self.expires_at, self.now)

    @property
    def _span(self) -> str:
        return span((self.expires_at - self.now).total_seconds())

    def text(self) -> str:
        """'expires in 4 min', 'expired 2 min ago' or 'no lease'."""
        if self.expires_at is None:
            return "no lease"
        return f"expired {self._span} ago" if self.expired else f"expires in {self._span}"

    def text_when_taken(self) -> str:
        """How it stood when it was taken away: 'lease had 4 min left' / 'expired 2 min ago'."""
        if self.expires_at is None:
            return "no lease"
        return f"expired {self._span} ago" if self.expired else f"lease had {self._span} left"

    def column(self) -> str:
        """The change list's short form: 'in 4 min', 'expired' or '—'."""
        if self.expires_at is None:
            return "—"
        return "expired" if self.expired else f"in {self._span}"


def now_is(task: Task | None) -> str:
    """What a task is now, for a lost race: 'COMPLETED v5', 'RUNNING v7, held by agent-2'."""
    if task is None:
        return "gone"
    held = f", held by {task.owner}" if task.stage == Stage.RUNNING and task.owner else ""
    return f"{task.stage} v{task.version}{held}"


def board_url(task_id: str) -> str:
    """The task's card on the live board (the board opens the card named by ?task=)."""
    return f"{reverse('board')}?{urlencode({'task': task_id})}"
