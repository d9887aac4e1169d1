"""An agent's hot requests, served by Django's own handler without the parts they never use.

A working agent sends the same few requests over and over (board.api.main.HOT_ROUTES: complete,
claim, complete a batch, renew, fail, release). Through Django's full path each also paid for
the URL resolver's walk, for middleware that never acts on an agent's request (CSRF, messages)
and for django-ninja's per-request machinery around the endpoint (docs/benchmarks.md has what
that came to). `HotRequests` is the WSGI application the server runs (server/serving.py), in
front of Django's handler. A request that is

- `POST` to one of the hot routes' paths, with no query string,
- sent with `Authorization: Bearer …` and without a `Cookie` header (an agent, not a browser:
  a session's CSRF check needs the CSRF middleware),

goes through `HotHandler`: Django's WSGI handler (the same WSGIRequest; the same
request_started and request_finished signals, so the log's request context and the database
connections closed or given back to their pool; the same log line for a 4xx or 5xx) around the
settings' middleware minus SKIPPED_MIDDLEWARE. Inside the middleware, where Django would resolve
the URL and dispatch through django-ninja's view, it runs the view middleware (tracing's, when
on) and calls the route's endpoint with the caller django-ninja's authentication accepted and
the body its schema validated (`HotRoute.call`). Anything else (a key refused, a body refused)
is handed to the route's django-ninja `Operation.run`, so every refusal is django-ninja's own
answer; nothing has been written when it hands over. Every other request goes to Django's
handler unchanged.

tests/test_hot_requests.py sends the same requests (accepted, refused, malformed,
unauthenticated, from a disallowed Host, over plain HTTP under SECURE_SSL_REDIRECT, over HTTPS
with HSTS, a crash) through both and compares status, headers, body, rows, log lines and the
latency metric.
"""
from __future__ import annotations

import inspect
from typing import Any

from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler, get_path_info
from django.db import connections
from django.http import HttpResponseBase
from django.test.utils import override_settings
from django.urls import ResolverMatch
from pydantic import BaseModel

# Middleware that never acts on an API request without cookies: CSRF's only reads the CSRF
# cookie (its view check passes django-ninja's views, which are csrf_exempt, and it sets a
# cookie only when a view asked for a token), the messages middleware skips /api/ itself.
# The session and authentication middleware stay: a refused key falls through to the session
# authentication, which reads request.user (an anonymous one, without a cookie).
SKIPPED_MIDDLEWARE = frozenset({
    "django.middleware.csrf.CsrfViewMiddleware",
    "board.api.middleware.MessagesOutsideApi",
})
ENVIRON_KEY = "taskflow.hot_route"  # the route and path parameters HotRequests matched


class HotRoute:
    """One hot route: its path's pattern, its POST operation, and what Django's resolver says of
    its paths (the middleware reads `request.resolver_match`: the API's latency metric)."""

    def __init__(self, mounted, pattern, operation):
        self.pattern = pattern.pattern  # Django's RoutePattern: match() converts the path's parameters
        self.route = str(mounted.pattern) + str(pattern.pattern)  # as Django says: "api/tasks/<task_id>/complete"
        self.app_names, self.namespaces = [mounted.app_name], [mounted.namespace]
        self.callback = pattern.callback
        self.url_name = pattern.name
        self.operation = operation
        self.body_name, self.body_schema = _body_parameter(operation, set(self.pattern.converters))

    def resolver_match(self, kwargs: dict) -> ResolverMatch:
        """What Django's resolver answers for a path of this route."""
        return ResolverMatch(self.callback, (), kwargs, self.url_name, self.app_names, self.namespaces,
                             route=self.route, captured_kwargs=kwargs, extra_kwargs={})

    def call(self, request, path_kwargs: dict) -> HttpResponseBase:
        """What `operation.run(request, **path_kwargs)` answers. An accepted key and a body its
        schema takes go straight to the endpoint; anything else to `operation.run` itself."""
        operation = self.operation
        accepted = self.accepted(request) if self.body_schema is not None else None
        if accepted is None:
            return operation.run(request, **path_kwargs)
        request.auth, body = accepted
        try:
            result = operation.view_func(request, **path_kwargs, **{self.body_name: body})
            if isinstance(result, HttpResponseBase):
                return result
            return operation._result_to_response(request, result, operation.api.create_temporal_response(request))
        except Exception as exc:  # (as Operation.run)
            return operation.api.on_exception(request, exc)

    def accepted(self, request) -> tuple[Any, BaseModel] | None:
        """(who is calling, the body) when django-ninja's authentication accepts the request and
        the body's schema takes it; None otherwise."""
        operation = self.operation
        if operation.csrf_exempt:
            request._ninja_csrf_exempt = True  # (as Operation._run_checks)
        try:
            for authenticate in operation.auth_callbacks:  # (as Operation._run_authentication)
                principal = authenticate(request)
                if principal:
                    body = self.body(request)
                    return None if body is None else (principal, body)
        except Exception:  # it raises again in operation.run, which answers it
            return None
        return None

    def body(self, request) -> BaseModel | None:
        """The body as django-ninja's body parameter reads it (the API's parser, then the schema,
        with the request in the validation's context), when it is a JSON object the schema takes."""
        if not request.body:
            return None
        data = self.operation.api.parser.parse_body(request)
        return self.body_schema.model_validate(data, context={"request": request}) if isinstance(data, dict) else None


def _body_parameter(operation, path_names: set[str]) -> tuple[str | None, type | None]:
    """The endpoint's body parameter (its name, its schema) when the endpoint takes the request,
    its path's text parameters and one body, with synchronous authentication and no throttle;
    (None, None) otherwise: then django-ninja runs every request of it."""
    parameters = list(inspect.signature(operation.view_func, eval_str=True).parameters.values())[1:]
    body = [p for p in parameters if p.name not in path_names]
    if (len(body) != 1 or not (isinstance(body[0].annotation, type) and issubclass(body[0].annotation, BaseModel))
            or any(p.annotation is not str for p in parameters if p.name in path_names)
            or operation.throttle_objects or not operation.auth_callbacks
            or any(inspect.iscoroutinefunction(c) or inspect.iscoroutinefunction(getattr(c, "__call__", None))
                   or getattr(c, "is_async", False) for c in operation.auth_callbacks)):
        return None, None
    return body[0].name, body[0].annotation


def hot_routes() -> tuple[str, list[HotRoute]]:
    """(where the API is mounted: "/api/", the API's HOT_ROUTES that take POST, in the order
    Django tries them), from the URLconf's own patterns."""
    from django.urls import URLResolver, get_resolver

    from board.api.main import HOT_ROUTES

    mounted = [p for p in get_resolver().url_patterns if isinstance(p, URLResolver) and p.namespace == "api"]
    if len(mounted) != 1:
        return "/api/", []
    routes = []
    for pattern in mounted[0].url_patterns:
        if str(pattern.pattern) not in HOT_ROUTES:
            continue
        path_view = inspect.getclosurevars(pattern.callback).nonlocals["self"]  # django-ninja's PathView
        posts = [operation for operation in path_view.operations if "POST" in operation.methods]
        if len(posts) == 1:
            routes.append(HotRoute(mounted[0], pattern, posts[0]))
    return "/" + str(mounted[0].pattern), routes


class HotHandler(WSGIHandler):
    """Django's WSGI handler for the hot requests: the settings' middleware but
    SKIPPED_MIDDLEWARE, around the matched route's endpoint."""

    def load_middleware(self, is_async=False):
        with override_settings(MIDDLEWARE=[name for name in settings.MIDDLEWARE if name not in SKIPPED_MIDDLEWARE]):
            super().load_middleware(is_async)

    def _get_response(self, request):
        # Django's own (BaseHandler._get_response) with the URL already matched (HotRequests.match)
        # and the endpoint called by its route: the view middleware (tracing's, when on), then
        # the endpoint, an exception it lets out to the exception middleware.
        route, kwargs = request.META[ENVIRON_KEY]
        request.resolver_match = route.resolver_match(kwargs)
        for middleware_method in self._view_middleware:
            response = middleware_method(request, route.callback, (), kwargs)
            if response:
                return response
        try:
            return route.call(request, kwargs)
        except Exception as exc:
            response = self.process_exception_by_middleware(exc, request)
            if response is None:
                raise
            return response


class HotRequests:
    """WSGI application: an agent's hot requests to a HotHandler, every other to `django_app`."""

    def __init__(self, django_app):
        self.django = django_app
        self.prefix, self.routes = hot_routes()  # ("/api/", [...])
        if any(connections[alias].settings_dict.get("ATOMIC_REQUESTS") for alias in connections):
            self.routes = []  # every view in its transaction: Django's own path (make_view_atomic) for all
        self.handler = HotHandler()

    def __call__(self, environ, start_response):
        hot = self.match(environ)
        if hot is None:
            return self.django(environ, start_response)
        environ[ENVIRON_KEY] = hot
        return self.handler(environ, start_response)

    def match(self, environ) -> tuple[HotRoute, dict] | None:
        """(route, path parameters) of a hot request; None for any other. (The hot routes take
        no query: a request with one goes to Django's path, which judges it as it always has.)"""
        if (environ.get("REQUEST_METHOD") != "POST" or environ.get("QUERY_STRING") or "HTTP_COOKIE" in environ
                or not environ.get("HTTP_AUTHORIZATION", "").startswith("Bearer ")):
            return None
        path = get_path_info(environ)  # as Django's request.path_info
        if not path.startswith(self.prefix):
            return None
        rest = path[len(self.prefix):]
        for route in self.routes:
            matched = route.pattern.match(rest)  # (the rest of the path, args, kwargs), or None
            if matched is not None and not matched[0]:
                return route, matched[2]
        return None
