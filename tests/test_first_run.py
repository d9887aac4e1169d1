"""The first ten minutes: `make run` on a fresh clone ends with one banner (addresses, the first
administrator's password, the docs) that nothing pushes off the screen, the password logs in,
and the admin says whose it is."""
import http.cookiejar
import os
import re
import signal
import subprocess
import urllib.parse
import urllib.request

import pytest

from tests.live_server import LineReader, free_port
from tests.test_readme import copy_project, nothing_exported

RULE = "=" * 72
START_TIMEOUT = 180  # a first run migrates a new SQLite database on a shared 2-core machine


class MakeRun:
    """`make run` in a copy of the checkout, as a user types it in a new terminal (plus PORT)."""

    def __init__(self, where, port: int):
        self.port = port
        self.process = subprocess.Popen(
            ["make", "run"], cwd=where, env={**nothing_exported(), "PORT": str(port)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            start_new_session=True,  # its own group: Ctrl-C below reaches make, serve and the reaper
        )
        self.output = LineReader(self.process.stdout)

    def until_banner(self) -> tuple[list[str], list[str]]:
        """(the lines printed before the banner, the banner's lines)."""
        before: list[str] = []
        while (line := self.output.next(timeout=START_TIMEOUT)) != RULE:
            assert line is not None, "make run ended before its banner:\n" + "\n".join(before)
            before.append(line)
        banner = [line]
        while (line := self.output.next(timeout=10)) != RULE:
            assert line is not None, "\n".join(banner)
            banner.append(line)
        return before, banner + [line]

    def interrupt(self) -> list[str]:
        """Ctrl-C, as in the terminal (SIGINT to the foreground group); the lines printed after
        the banner, until the output ends."""
        os.killpg(self.process.pid, signal.SIGINT)
        rest = []
        while (line := self.output.next(timeout=30)) is not None:
            rest.append(line)
        self.process.wait(timeout=30)
        return rest

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)


def log_in(port: int, username: str, password: str) -> tuple[str, str]:
    """Log in through the admin's own login form over HTTP: (the final URL's path, its page)."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    base = f"http://127.0.0.1:{port}"
    form = opener.open(f"{base}/admin/login/?next=/admin/", timeout=30).read().decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    body = urllib.parse.urlencode({"csrfmiddlewaretoken": csrf, "username": username,
                                   "password": password, "next": "/admin/"}).encode()
    answer = opener.open(f"{base}/admin/login/", data=body, timeout=30)
    return urllib.parse.urlsplit(answer.url).path, answer.read().decode()


def test_make_run_ends_with_one_banner_whose_password_logs_in(tmp_path):
    where = copy_project(tmp_path / "p")
    port = free_port()
    first = MakeRun(where, port)
    try:
        before, banner = first.until_banner()
        # No echoed recipe, no migration line; at most make's own note that it installs the pins.
        assert [line for line in before if not line.startswith(("Installing the pinned", "Creating .venv"))] == []
        text = "\n".join(banner)
        assert f"TaskFlow board is ready on http://127.0.0.1:{port}/" in text
        for where_to in (f"http://127.0.0.1:{port}/board/", f"http://127.0.0.1:{port}/admin/",
                         f"http://127.0.0.1:{port}/api/docs", str(where / "README.md")):
            assert where_to in text
        login = re.search(r"login +user (\S+) +password (\S+)", text)
        assert login, text
        username, password = login.groups()
        assert username == "admin" and len(password) >= 12

        assert log_in(port, username, "not-the-password")[0] == "/admin/login/"  # refused: the form again
        path, page = log_in(port, username, password)
        assert path == "/admin/" and "Log out" in page and "TaskFlow board" in page

        after = first.interrupt()
        # The requests above logged nothing, and stopping printed nothing of ours (make may
        # say that it was interrupted): the banner stayed the last thing on the screen.
        assert [line for line in after if not line.startswith("make: ***")] == [], "\n".join(after)
        assert password not in "\n".join(after)
    finally:
        first.kill()

    again = MakeRun(where, port)
    try:
        before, banner = again.until_banner()
        text = "\n".join(banner)
        assert before == [] and "password" not in text and "existing staff user" in text, text
    finally:
        again.kill()


@pytest.mark.django_db
def test_the_admin_says_taskflow_board_and_links_to_the_board(client):
    page = client.get("/admin/login/").content.decode()
    assert "TaskFlow board" in page and "Django administration" not in page
    assert re.search(r"<title>[^<]*TaskFlow board</title>", page), page

    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.create_superuser("root", "", "a-long-passphrase-1"))
    index = client.get("/admin/").content.decode()
    assert "Django administration" not in index and '<a href="/board/">' in index
