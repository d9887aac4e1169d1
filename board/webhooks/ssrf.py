"""Webhooks must not become a way into the operator's network (SSRF). The rule, applied to every
delivery (and, for what can be told from the URL alone, at create):

- only `http` and `https` URLs, with a host;
- the host is resolved at delivery time and EVERY address it resolves to must be public: no
  loopback, private (RFC 1918, unique-local), link-local (169.254.0.0/16, which holds the cloud
  metadata address 169.254.169.254; fe80::/10), shared (100.64.0.0/10), reserved, multicast or
  unspecified address, nor an IPv4-mapped or NAT64 form of one; the metadata addresses
  169.254.169.254 and fd00:ec2::254 are named explicitly;
- the connection goes to the address that was checked (no second resolution: a DNS rebinding
  answer between the check and the connect cannot redirect it), with the URL's host in the
  `Host` header and, over TLS, as the certificate's expected name (SNI);
- redirects are not followed (a 3xx answer is a failed attempt);
- unless `TASKFLOW_WEBHOOK_ALLOWED_HOSTS` (a comma list of host names or IP addresses, compared
  case-insensitively with the URL's host) names the URL's host: then its addresses are not judged.

Standard library only (http.client, ssl, socket, ipaddress): no proxy from the environment is
ever used (http.client reads none)."""
from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from urllib.parse import SplitResult, urlsplit

from django.conf import settings

from board.engine.limits import MAX_WEBHOOK_URL_CHARS

METADATA = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})
NAT64 = ipaddress.ip_network("64:ff9b::/96")


class Refused(Exception):
    """The URL or the address it resolves to is not one the board sends to."""


def allowed_hosts() -> frozenset[str]:
    """TASKFLOW_WEBHOOK_ALLOWED_HOSTS, as lowercase host names (settings.py reads the variable)."""
    return frozenset(h.strip().lower().strip("[]") for h in getattr(settings, "TASKFLOW_WEBHOOK_ALLOWED_HOSTS", ())
                     if h.strip())


def parse(url: str) -> SplitResult:
    """The URL, if its form is acceptable (scheme, host, port, length, no control characters);
    else Refused naming what is wrong. Says nothing of where the host points."""
    if not isinstance(url, str) or not url:
        raise Refused("url must be an http or https URL")
    if len(url) > MAX_WEBHOOK_URL_CHARS:
        raise Refused(f"url is over {MAX_WEBHOOK_URL_CHARS} characters")
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise Refused("url may not contain spaces or control characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise Refused(f"url must be http or https, not {parts.scheme or 'a relative address'!r}")
    try:
        port = parts.port
    except ValueError:
        raise Refused("url has an invalid port") from None
    if not parts.hostname:
        raise Refused("url has no host")
    if port == 0:
        raise Refused("url has an invalid port")
    return parts


def address_refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why the board does not send to `ip`, or None for a public address."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return address_refusal(ip.ipv4_mapped)
        if ip in NAT64:
            return address_refusal(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip in METADATA:
        return "a cloud metadata address"
    for kind, test in (("a loopback", ip.is_loopback), ("a link-local", ip.is_link_local),
                       ("a multicast", ip.is_multicast), ("an unspecified", ip.is_unspecified),
                       ("a private", ip.is_private), ("a reserved", ip.is_reserved)):
        if test:
            return f"{kind} address"
    if not ip.is_global:
        return "a non-public address"
    return None


def check_literal(url: str) -> SplitResult:
    """At create: the URL's form, and its host when it is an IP address (or `localhost`) that the
    rule refuses and the allow-list does not name. A host name is judged at each delivery."""
    parts = parse(url)
    host = parts.hostname.lower()
    if host in allowed_hosts():
        return parts
    if host == "localhost" or host.endswith(".localhost"):
        raise Refused(f"{host} is a loopback host; name it in TASKFLOW_WEBHOOK_ALLOWED_HOSTS to send there")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return parts
    why = address_refusal(ip)
    if why:
        raise Refused(f"{host} is {why}; name it in TASKFLOW_WEBHOOK_ALLOWED_HOSTS to send there")
    return parts


def resolve(parts: SplitResult) -> tuple[str, int]:
    """The address to connect to for `parts`: (ip, port), every address the host resolves to
    judged by the rule (one refused address refuses the host: a name that also points inside is
    not sent to), unless the allow-list names the host. Refused otherwise."""
    host = parts.hostname.lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise Refused(f"{host} does not resolve: {exc}") from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not addresses:
        raise Refused(f"{host} does not resolve")
    if host not in allowed_hosts():
        for address in addresses:
            why = address_refusal(ipaddress.ip_address(address.split("%", 1)[0]))
            if why:
                raise Refused(f"{host} resolves to {address}, {why}; name the host in "
                              f"TASKFLOW_WEBHOOK_ALLOWED_HOSTS to send there")
    return addresses[0], port


class _PinnedHTTP(http.client.HTTPConnection):
    """An HTTP connection to the address checked, whatever the host name resolves to now."""

    def __init__(self, host: str, port: int, ip: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._ip = ip

    def connect(self):
        self.sock = socket.create_connection((self._ip, self.port), self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """The same over TLS: the certificate is checked against the URL's host (SNI too)."""

    def __init__(self, host: str, port: int, ip: str, timeout: float):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._ip = ip

    def connect(self):
        sock = socket.create_connection((self._ip, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, str]:
    """POST `body` to `url` under the rule: (status, the first 200 characters of the answer's
    body). Refused when the rule says no (nothing is sent); OSError / http.client errors when the
    receiver is unreachable or misbehaves. Never follows a redirect."""
    parts = parse(url)
    ip, port = resolve(parts)
    cls = _PinnedHTTPS if parts.scheme == "https" else _PinnedHTTP
    connection = cls(parts.hostname, port, ip, timeout)
    try:
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        connection.request("POST", path, body=body, headers=headers)
        answer = connection.getresponse()
        text = answer.read(200).decode("utf-8", "replace")
        location = answer.getheader("Location")
        if 300 <= answer.status < 400 and location:
            text = f"redirect to {location[:200]} not followed"
        return answer.status, text
    finally:
        connection.close()
