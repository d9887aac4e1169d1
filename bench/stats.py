"""The one percentile of the benchmarks, so that every "p99" they print is the same statistic."""
from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], pct: float) -> float:
    """Nearest-rank percentile: the smallest value with at least `pct` percent of `values` at or
    below it, i.e. the ceil(pct/100 * n)-th smallest of n (the smallest for pct 0). Always one of
    the measured values, never an interpolation between two, so a p99 is a latency some request
    really had. `values` need not be sorted; NaN when there are none.

    Of 100 values, p50 is the 50th smallest, p99 the 99th and p100 the largest; of 10 values,
    p99 is the largest (ceil(9.9) = 10)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    if not 0 <= pct <= 100:
        raise ValueError(f"a percentile is between 0 and 100, not {pct!r}")
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]
