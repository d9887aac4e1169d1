"""One route, to the bare view: a JSON answer with no database work, behind the project's
middleware stack (settings.MIDDLEWARE), under /api/ (BARE_PATH) so that it meets that stack as
an API request does. The ceiling of the serving stack, whatever the engine."""
from django.http import JsonResponse
from django.urls import path

from bench.http_agent import BARE_PATH


def bare(request):
    return JsonResponse({"ok": True})


urlpatterns = [path(BARE_PATH.lstrip("/"), bare)]
