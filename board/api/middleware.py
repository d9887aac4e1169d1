"""Under /api/, every answer is the API's one error shape, so a client parses every error the
same way, whatever made it:

- a URL whose path or query holds a NUL character, or whose query is not UTF-8, is refused
  (422 `validation_error`) before any view sees it: PostgreSQL refuses NUL in text, and Django
  would quietly turn bytes that are not UTF-8 into U+FFFD;
- answers Django makes by itself (400 for a Host not allowed, 404 for an unknown path, 405 for
  a wrong method) and a crash (500, which Django renders as HTML) come as JSON instead.
"""
from urllib.parse import unquote_to_bytes

from asgiref.sync import iscoroutinefunction
from django.contrib.messages.middleware import MessageMiddleware
from django.http import JsonResponse
from django.utils.decorators import sync_and_async_middleware

from board.engine.errors import InvalidRequest

API_PREFIX = "/api/"
CODES = {
    # Django's own refusals (a Host not in ALLOWED_HOSTS, a malformed request) before the API.
    400: ("bad_request", "the request is malformed"),
    # Not "not_found": a client with a wrong base URL must not read every answer as "no such task".
    404: ("no_such_endpoint", "no such API endpoint"),
    405: ("method_not_allowed", "this endpoint does not take that method"),
    500: ("internal_error", "the server failed on this request; it is logged"),
}


def _unreadable_url(request) -> str | None:
    """Why the request's URL cannot be read as text the board may store, or None."""
    if "\x00" in request.path:
        return "the URL's path holds a NUL character (%00)"
    # The WSGI server hands the raw query over as latin-1 (PEP 3333): back to its bytes first.
    raw = unquote_to_bytes(request.META.get("QUERY_STRING", "").encode("latin-1", "replace").replace(b"+", b" "))
    if b"\x00" in raw:
        return "the URL's query holds a NUL character (%00)"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return "the URL's query is not UTF-8"
    return None


def _refusal(request):
    if request.path.startswith(API_PREFIX) and (why := _unreadable_url(request)):
        return JsonResponse({"error": {"code": InvalidRequest.code, "message": why}}, status=InvalidRequest.http_status)
    return None


def _reshape(request, response):
    if (
        request.path.startswith(API_PREFIX)
        and response.status_code in CODES
        and not response.get("Content-Type", "").startswith("application/json")
    ):
        code, message = CODES[response.status_code]
        reshaped = JsonResponse({"error": {"code": code, "message": f"{message}: {request.method} {request.path}"}},
                                status=response.status_code)
        if response.has_header("Allow"):
            reshaped["Allow"] = response["Allow"]
        # Django logs a 5xx once, when it is made; the reshaped answer is the same 5xx.
        reshaped._has_been_logged = getattr(response, "_has_been_logged", False)
        return reshaped
    return response


@sync_and_async_middleware
def api_error_shape(get_response):
    if iscoroutinefunction(get_response):
        async def middleware(request):
            return _refusal(request) or _reshape(request, await get_response(request))
    else:
        def middleware(request):
            return _refusal(request) or _reshape(request, get_response(request))
    return middleware


class MessagesOutsideApi(MessageMiddleware):
    """Django's messages (the admin's "3 tasks requeued" notes), for every page but the API's.
    An API answer is JSON and never shows a message, yet the stock middleware builds a signed
    cookie store and a session store for every request: about 3% of a claim's CPU. The admin's
    system check wants MessageMiddleware (or a subclass) in MIDDLEWARE: this is one. A request
    without `request._messages` is one the stock process_response already leaves alone."""

    def process_request(self, request):
        if not request.path.startswith(API_PREFIX):
            super().process_request(request)
