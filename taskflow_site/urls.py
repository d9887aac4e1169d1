from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from board.api.main import api
from board.health import healthz
from board.live.board_filter import board_filter
from board.live.graph import graph_data, graph_page
from board.live.tasks_table import tasks_export, tasks_page
from board.live.views import board_page, favicon, task_page
from board.metrics import metrics_view

# The admin is the operators' side of the board: it says so on every page (not "Django
# administration"), and its "View site" link leads to the live board.
admin.site.site_header = "TaskFlow board"
admin.site.site_title = "TaskFlow board"
admin.site.index_title = "TaskFlow board"
admin.site.site_url = "/board/"

urlpatterns = [
    # The agents' API first: its requests are the many (a path's patterns are tried in order).
    path("api/", api.urls),
    path("", RedirectView.as_view(url="/board/", permanent=False)),
    path("board/", board_page, name="board"),
    path("board/filter", board_filter, name="board-filter"),  # the board's filter, over every task
    path("board/task/<str:task_id>", task_page, name="board-task"),  # one task, whole
    path("board/graph/", graph_page, name="board-graph"),  # a plan's dependency graph
    path("board/graph/data", graph_data, name="board-graph-data"),
    path("board/tasks/", tasks_page, name="tasks"),  # every task, paged, with its export
    path("board/tasks/export", tasks_export, name="tasks_export"),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("favicon.ico", favicon, name="favicon"),
]
