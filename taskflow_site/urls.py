from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from board.api.main import api
from board.health import healthz
from board.live.views import board_page, favicon
from board.metrics import metrics_view

# The all-tasks table and its export (issue 30, item 17): a block of its own.
from board.live.tasks_table import tasks_export, tasks_page  # noqa: E402

# The admin is the operators' side of the board: it says so on every page (not "Django
# administration"), and its "View site" link leads to the live board.
admin.site.site_header = "TaskFlow board"
admin.site.site_title = "TaskFlow board"
admin.site.index_title = "TaskFlow board"
admin.site.site_url = "/board/"

urlpatterns = [
    path("", RedirectView.as_view(url="/board/", permanent=False)),
    path("board/", board_page, name="board"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("favicon.ico", favicon, name="favicon"),
]

# The all-tasks table (board/live/tasks_table.py).
urlpatterns += [
    path("board/tasks/", tasks_page, name="tasks"),
    path("board/tasks/export", tasks_export, name="tasks_export"),
]
