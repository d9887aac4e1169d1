"""Which pages may open the board's socket: the Origin check of every websocket (asgi.py).

A browser sends the Origin of the page that opens a socket, and sends the user's session cookie
whatever that page is; so a page of another site (or of another server on the same host, or the
plain-http twin of an https site) must not get a socket that streams the board. The rule, on
scheme, host and port alike (default ports filled in: http 80, https 443):

1. the request's Host must be one ALLOWED_HOSTS allows (as for every HTTP request; a
   DNS-rebinding page, whose origin is its own host, fails here), and
2. the Origin must be the page's own origin: the scheme the socket came in on (ws → http,
   wss → https) with the request's Host; or equal one listed in CSRF_TRUSTED_ORIGINS (exactly,
   or `scheme://*.domain[:port]` for its subdomains, as Django reads that setting).

The scheme the socket came in on is the connection's, or, behind a TLS proxy, what the proxy
says: uvicorn takes X-Forwarded-Proto from the addresses in FORWARDED_ALLOW_IPS (127.0.0.1 by
default: deploy/nginx.conf's proxy on the same host), and with SECURE_PROXY_SSL_HEADER set
(Django's setting, SECURE_PROXY_SSL_HEADER=1 in the environment) that header decides, as it does
for Django's HTTP requests. A proxy on another host that is trusted for neither lists the
public origin in CSRF_TRUSTED_ORIGINS instead. A socket without an Origin is refused.
Refusals are a 403 before the handshake (Channels' WebsocketDenier).
"""
from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

DEFAULT_PORTS = {"http": 80, "https": 443}

Origin = tuple[str, str, int]  # (scheme, host, port), lower case


def parse_origin(text: str) -> Origin | None:
    """An Origin header (or a CSRF_TRUSTED_ORIGINS entry) as (scheme, host, port); None when it is
    not an http(s) origin (e.g. "null")."""
    try:
        parts = urlsplit(text.strip())
        scheme, host, port = parts.scheme.lower(), parts.hostname, parts.port
    except ValueError:  # a port that is not a number, a broken IPv6 literal
        return None
    if scheme not in DEFAULT_PORTS or not host or parts.username or parts.password:
        return None
    return scheme, host.lower(), port or DEFAULT_PORTS[scheme]


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def page_scheme(scope) -> str:
    """http or https: how the page that opened this socket was served."""
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:  # ("HTTP_X_FORWARDED_PROTO", "https"): Django's rule for request.is_secure()
        header, secure_value = proxy
        sent = _header(scope, header.removeprefix("HTTP_").replace("_", "-").lower().encode())
        if sent is not None:
            return "https" if sent.split(",", 1)[0].strip() == secure_value else "http"
    return "https" if scope.get("scheme") in ("wss", "https") else "http"


def allowed_hosts() -> list[str]:
    hosts = settings.ALLOWED_HOSTS
    if settings.DEBUG and not hosts:  # as Django's HttpRequest.get_host()
        hosts = [".localhost", "127.0.0.1", "[::1]"]
    return hosts


def page_origin(scope) -> Origin | None:
    """The origin of the page this socket belongs to: its scheme with the request's Host; None
    when the Host is missing or not allowed."""
    host = _header(scope, b"host")
    if not host:
        return None
    domain, port = split_domain_port(host)
    if not domain or not validate_host(domain, allowed_hosts()):
        return None
    scheme = page_scheme(scope)
    try:
        number = int(port) if port else DEFAULT_PORTS[scheme]
    except ValueError:
        return None
    return scheme, domain.strip("[]"), number


def _trusted(origin: Origin) -> bool:
    scheme, host, port = origin
    for entry in getattr(settings, "CSRF_TRUSTED_ORIGINS", ()):
        trusted = parse_origin(entry)
        if trusted is None or trusted[0] != scheme or trusted[2] != port:
            continue
        if trusted[1].startswith("*."):  # as Django's CSRF check: "*.example.com" takes a.example.com
            if is_same_domain(host, trusted[1][1:]):
                return True
        elif trusted[1] == host:
            return True
    return False


def origin_allowed(scope) -> bool:
    page = page_origin(scope)
    sent = _header(scope, b"origin")
    origin = parse_origin(sent) if sent else None
    if page is None or origin is None:
        return False
    return origin == page or _trusted(origin)


class SameOriginOnly:
    """ASGI middleware for the websocket side: refuses (403) a socket whose Origin the rule above
    does not allow, before anything else sees it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.app(scope, receive, send)
