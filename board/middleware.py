"""Under /api/, answers Django makes by itself (404 for an unknown path, 405 for a wrong method)
come in the API's one error shape instead of HTML, so a client parses every error the same way."""
from asgiref.sync import iscoroutinefunction
from django.http import JsonResponse
from django.utils.decorators import sync_and_async_middleware

API_PREFIX = "/api/"
# Not "not_found": a client with a wrong base URL must not read every answer as "no such task".
CODES = {404: ("no_such_endpoint", "no such API endpoint"), 405: ("method_not_allowed", "this endpoint does not take that method")}


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
        return reshaped
    return response


@sync_and_async_middleware
def api_error_shape(get_response):
    if iscoroutinefunction(get_response):
        async def middleware(request):
            return _reshape(request, await get_response(request))
    else:
        def middleware(request):
            return _reshape(request, get_response(request))
    return middleware
