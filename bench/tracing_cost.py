"""What the engine's tracing hook (board/engine/tracing.py) costs while tracing is off, the
default, and what tracing on costs, for scale.

Two measurements, in one run:

- **The hook alone**: a do-nothing function called bare, and the same function under
  ``tracing.traced`` with tracing off (the hook's test of one global, and a call frame), with
  ``timeit``, best of several repeats: nanoseconds per call.
- **A claim -> complete cycle**: ``transitions.claim_next`` then ``transitions.complete``, in this
  process on a fresh SQLite file configured like the project's default (no HTTP: the hook is in
  the engine), one thread, in three variants that alternate in rounds (so that the machine's
  changing load weighs on each alike), the same number of cycles each, on freshly seeded tasks:
  - ``before``: the verbs without the hook (each traced verb's ``__wrapped__``: the verb as it
    was before tracing came, its other decorators included);
  - ``off``: the verbs as they are, tracing off;
  - ``on``: the engine's spans on (no Django or psycopg instrumentation), made by the SDK's
    TracerProvider and handed to an exporter that drops them: the cost of making the spans,
    not of sending them.

  Printed: microseconds per cycle per round, and the median of the rounds per variant.

    .venv/bin/python bench/tracing_cost.py [--cycles 2000] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from bench import claims  # noqa: E402  (after the path: run as a script from anywhere)

ALIAS = claims.ALIASES["sqlite"]


def hook_alone() -> tuple[float, float]:
    """(ns per bare call, ns per call through the hook with tracing off)."""
    from board.engine import tracing

    def verb(task_id, *, using="default"):
        return task_id

    hooked = tracing.traced("claim")(verb)
    assert not tracing.enabled()
    number = 1_000_000
    bare = min(timeit.repeat(lambda: verb("t", using="x"), number=number, repeat=5)) / number
    through = min(timeit.repeat(lambda: hooked("t", using="x"), number=number, repeat=5)) / number
    return bare * 1e9, through * 1e9


def verbs(variant: str):
    from board.engine import transitions

    if variant == "before":
        return transitions.claim_next.__wrapped__, transitions.complete.__wrapped__
    return transitions.claim_next, transitions.complete


def run_slice(variant: str, cycles: int) -> float:
    """Microseconds per claim -> complete cycle, over `cycles` cycles on fresh tasks."""
    from board.engine import tracing

    claims.clear(ALIAS)
    claims.seed_with_engine(ALIAS, cycles, tied=False)
    claim_next, complete = verbs(variant)
    provider = None
    if variant == "on":
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

        class Drop(SpanExporter):
            def export(self, spans):
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(Drop()))
        tracing.enable(provider.get_tracer("bench"))
    try:
        started = time.perf_counter()
        for _ in range(cycles):
            claim = claim_next("bench-agent", 60, using=ALIAS)
            complete(claim.task.pk, claim.lease.token, {"ok": True}, using=ALIAS)
        elapsed = time.perf_counter() - started
    finally:
        tracing.disable()
        if provider is not None:
            provider.shutdown()
    return elapsed / cycles * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=2000, help="cycles per variant per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="taskflow-tracing-bench-") as folder:
        claims.configure_django(Path(folder) / "bench.sqlite3", None)
        claims.migrate(ALIAS)
        bare, through = hook_alone()
        print(f"the hook alone, tracing off: {through:.0f} ns per call through it, {bare:.0f} ns bare "
              f"({through - bare:.0f} ns added)")
        variants = ("before", "off", "on")
        results: dict[str, list[float]] = {v: [] for v in variants}
        run_slice("off", min(args.cycles, 200))  # warm up: connections, statement caches
        for round_number in range(1, args.rounds + 1):
            order = variants if round_number % 2 else variants[::-1]
            for variant in order:
                results[variant].append(run_slice(variant, args.cycles))
            print(f"round {round_number}: " + ", ".join(f"{v} {results[v][-1]:.1f} us" for v in variants))
        median = {v: statistics.median(results[v]) for v in variants}
        print(f"claim -> complete on SQLite, {args.cycles} cycles x {args.rounds} rounds, median us per cycle: "
              f"before {median['before']:.1f}, tracing off {median['off']:.1f} "
              f"({median['off'] - median['before']:+.1f}), engine spans on {median['on']:.1f} "
              f"({median['on'] - median['before']:+.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
