"""Where a sampled server's time went: the share of py-spy samples per function.

`bench/http_claims.py --py-spy DIR` records each run with `py-spy record --gil --subprocesses
--format raw` into DIR/<run>.txt (one line per distinct stack: frames separated by ";", then
the sample count). This prints, for one such file, every function's share of the samples:
cumulative (the function was anywhere on the stack: it or what it called was running) and self
(it was the innermost frame). With --gil a sample is taken only from the thread holding the GIL,
so the shares are of the Python CPU time of the server's processes.

    .venv/bin/python bench/http_claims.py --agents 8 --backends sqlite --py-spy /tmp/prof
    .venv/bin/python bench/py_spy_summary.py /tmp/prof/sqlite-w2-x8.txt
    .venv/bin/python bench/py_spy_summary.py /tmp/prof/sqlite-w2-x8.txt --match board/ --top 40

Standard library only.
"""
from __future__ import annotations

import argparse
import re
import signal
from collections import Counter
from pathlib import Path

_LINE_NUMBER = re.compile(r":\d+\)")
# py-spy's first frames name the process (its command line, quoted, may hold ";") and the thread.
_PROCESS_AND_THREAD = re.compile(r'^(?:process \d+:"(?:[^"\\]|\\.)*";|thread \([^)]*\)[^;]*;)+')


def function_of(frame: str) -> str:
    """A frame without its line number: `name (file.py:12)` -> `name (file.py)`."""
    return _LINE_NUMBER.sub(")", frame)


def summarise(path: Path) -> tuple[int, Counter, Counter]:
    """(samples, cumulative samples per function, self samples per function)."""
    total, cumulative, own = 0, Counter(), Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [function_of(f) for f in _PROCESS_AND_THREAD.sub("", stack).split(";") if f]
        total += n
        for function in set(frames):
            cumulative[function] += n
        if frames:
            own[frames[-1]] += n
    return total, cumulative, own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="a raw py-spy file (bench/http_claims.py --py-spy DIR)")
    parser.add_argument("--top", type=int, default=30, help="functions per list (default 30)")
    parser.add_argument("--match", default="", help="only functions whose name or file contains this")
    args = parser.parse_args()
    total, cumulative, own = summarise(args.file)
    if not total:
        raise SystemExit(f"{args.file}: no samples")
    print(f"{args.file}: {total} samples")
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly
    for title, counts in (("cumulative (on the stack)", cumulative), ("self (innermost frame)", own)):
        print(f"\n{title}:")
        shown = [(f, n) for f, n in counts.most_common() if args.match in f][: args.top]
        for function, n in shown:
            print(f"{100 * n / total:6.1f}%  {function}")


if __name__ == "__main__":
    main()
