from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from board.api import api
from board.health import healthz
from board.views import board_page

urlpatterns = [
    path("", RedirectView.as_view(url="/board/", permanent=False)),
    path("board/", board_page, name="board"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("healthz", healthz, name="healthz"),
]
