#!/usr/bin/env python3
"""Fill deploy/nginx.conf's @NAME@ placeholders (standard library only).

    python3 deploy/render_nginx.py --public-url https://board.example.com \\
        --upstream 10.0.0.11:8000 --upstream 10.0.0.12:8000 \\
        --cert /etc/ssl/board/fullchain.pem --key /etc/ssl/board/privkey.pem \\
        --static-root /srv/taskflow/.staticfiles > /etc/nginx/conf.d/taskflow.conf

The server name and the listen ports follow from --public-url (HTTPS on its port, 443 by
default; HTTP on 80) unless --server-name, --listen-https or --listen-http say otherwise.

`--sandbox DIR` writes DIR/taskflow.conf and DIR/nginx.conf instead: a complete configuration
whose pid file, logs and temporary files are all inside DIR, to try the proxy without touching
/etc/nginx (the test suite runs it so):

    nginx -c DIR/nginx.conf -g 'daemon off;'

(When nginx starts as root its workers run as `nobody`: DIR and the static folder must then be
readable by others.)
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

TEMPLATE = Path(__file__).resolve().parent / "nginx.conf"
PLACEHOLDER = re.compile(r"@([A-Z_]+)@")
# Values are pasted into nginx directives: nothing that would end or open one.
UNSAFE = re.compile(r"[\s;{}'\"$#\\]")


def _checked(name: str, value: str) -> str:
    if not value or UNSAFE.search(value):
        raise ValueError(f"{name}: {value!r} is empty or has a character nginx would misread")
    return value


def _absolute(name: str, value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{name}: {value!r} is not an absolute path")
    return _checked(name, value)


def upstream_lines(upstreams: list[str], indent: str = "    ") -> str:
    """One `server` line per `host:port` (the first line is not indented: it replaces the
    placeholder, which already is)."""
    if not upstreams:
        raise ValueError("at least one --upstream host:port is needed")
    lines = []
    for address in upstreams:
        _checked("upstream", address)
        if not re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):\d{1,5}", address):
            raise ValueError(f"upstream: {address!r} is not host:port")
        lines.append(f"server {address} max_fails=1 fail_timeout=10s;")
    return f"\n{indent}".join(lines)


def values_for(*, public_url: str, upstreams: list[str], cert: str, key: str, static_root: str,
               server_name: str | None = None, listen_https: str | None = None,
               listen_http: str | None = None) -> dict[str, str]:
    parts = urlsplit(public_url)
    if parts.scheme != "https" or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"--public-url must be https://host[:port], not {public_url!r}")
    return {
        "SERVER_NAME": _checked("server name", server_name or parts.hostname),
        "PUBLIC_URL": _checked("public url", f"https://{parts.netloc}"),
        "LISTEN_HTTPS": _checked("listen https", listen_https or str(parts.port or 443)),
        "LISTEN_HTTP": _checked("listen http", listen_http or "80"),
        "UPSTREAMS": upstream_lines(upstreams),
        "CERT": _absolute("cert", cert),
        "KEY": _absolute("key", key),
        "STATIC_ROOT": _absolute("static root", static_root.rstrip("/")),
    }


def render(values: dict[str, str], template: str | None = None) -> str:
    """The template with every placeholder filled; an unknown or unfilled one is an error."""
    text = TEMPLATE.read_text() if template is None else template
    # Placeholders are filled outside comments only (the header documents them by name).
    out = []
    for line in text.splitlines(keepends=True):
        code, sep, comment = line.partition("#")
        for name in PLACEHOLDER.findall(code):
            if name not in values:
                raise ValueError(f"no value for @{name}@")
        out.append(PLACEHOLDER.sub(lambda m: values[m.group(1)], code) + sep + comment)
    return "".join(out)


def sandbox_main(directory: Path, site: Path, mime_types: str = "/etc/nginx/mime.types") -> str:
    """A complete nginx.conf around `site` with everything nginx writes inside `directory`."""
    d = directory.resolve()
    for path in (d, site):
        _checked("sandbox path", str(path))
    types = f"include {mime_types};" if Path(mime_types).exists() else \
        "types { text/html html; text/css css; application/javascript js; application/json json; }"
    return f"""# A sandbox around taskflow.conf (deploy/render_nginx.py --sandbox): run with
#   nginx -c {d}/nginx.conf -g 'daemon off;'
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log notice;

events {{
    worker_connections 512;
}}

http {{
    {types}
    default_type application/octet-stream;
    sendfile on;
    log_format upstreams '$remote_addr "$request" $status upstream=$upstream_addr '
                         'upstream_status=$upstream_status time=$request_time';
    access_log {d}/access.log upstreams;
    client_body_temp_path {d}/temp/body;
    proxy_temp_path {d}/temp/proxy;
    fastcgi_temp_path {d}/temp/fastcgi;
    uwsgi_temp_path {d}/temp/uwsgi;
    scgi_temp_path {d}/temp/scgi;

    include {site};
}}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--public-url", required=True, help="https://host[:port] the users and agents use")
    parser.add_argument("--upstream", action="append", required=True, metavar="HOST:PORT",
                        help="a board server (`manage.py serve`); repeat for each host")
    parser.add_argument("--cert", required=True, help="certificate chain (PEM)")
    parser.add_argument("--key", required=True, help="private key (PEM)")
    parser.add_argument("--static-root", required=True, help="the collectstatic folder")
    parser.add_argument("--server-name", help="default: the public URL's host")
    parser.add_argument("--listen-https", help="default: the public URL's port, or 443")
    parser.add_argument("--listen-http", help="default: 80")
    parser.add_argument("--sandbox", metavar="DIR", type=Path,
                        help="write DIR/taskflow.conf and a complete DIR/nginx.conf around it")
    args = parser.parse_args(argv)
    try:
        site = render(values_for(
            public_url=args.public_url, upstreams=args.upstream, cert=args.cert, key=args.key,
            static_root=args.static_root, server_name=args.server_name,
            listen_https=args.listen_https, listen_http=args.listen_http))
        if args.sandbox is None:
            sys.stdout.write(site)
            return 0
        directory = args.sandbox.resolve()
        (directory / "temp").mkdir(parents=True, exist_ok=True)
        (directory / "taskflow.conf").write_text(site)
        (directory / "nginx.conf").write_text(sandbox_main(directory, directory / "taskflow.conf"))
    except ValueError as exc:
        parser.error(str(exc))
    print(f"nginx -c {directory}/nginx.conf -g 'daemon off;'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
