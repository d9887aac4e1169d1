from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from board.api.main import api
from board.health import healthz
from board.live.views import board_page, favicon
from board.metrics import metrics_view

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

# A task's own page (issue 30, item 16).
from board.live.views import task_page  # noqa: E402  (kept in its own block beside the board's)

urlpatterns += [
    path("board/task/<str:task_id>", task_page, name="board-task"),
]
