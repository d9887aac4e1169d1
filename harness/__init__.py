"""Real servers and the helpers around them, shared by the tests and the benchmarks.

- `harness.board_server`: the board's own server (`manage.py serve`, as `make run` starts it) on
  a free port, `manage()` for another management command on the same database, `wait_until`,
  `api_call`, `LineReader`, `stop_process`.
- `harness.browser`: Debian's Chromium driven by Playwright, and Debian's nginx.
- `harness.mongodb_server`: a MongoDB replica set for a run (TEST_MONGO_URL, or a SecantusDB
  server started for it, `harness.secantus_server`).

Why a package of its own, and why this name: the benchmarks are run after `make run`, which
installs requirements.txt only, so what they share with the tests cannot live under `tests/`
(its conftest and fixtures need pytest) nor in the product (`board/`, `taskflow_site/`), which
never starts servers. It is neither test code nor product code but the harness that starts real
processes for whoever checks or measures the board; "testkit" would suggest the test install.

The rule that keeps it so: nothing here imports pytest or `tests`, and a package outside
requirements.txt (playwright, SecantusDB) is imported only where it is used, behind a check that
says it comes with `make test`'s install (requirements-test.txt). tests/test_bench_imports.py
holds this package and bench/ to it.
"""

# Where a package outside requirements.txt comes from, for the messages that name one.
TEST_INSTALL = ("it comes with requirements-test.txt, which `make test` installs "
                "(or: .venv/bin/pip install -r requirements-test.txt)")
