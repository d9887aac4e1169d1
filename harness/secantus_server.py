"""`secantusd-py` (SecantusDB, the MongoDB session's test server) with the fixes the board's
tests need, applied in its own process at start. Test-time only: nothing in the product
imports SecantusDB.

- Nested inclusion in `$project`: MongoDB reads `{"$project": {"sub": {"k": 1}}}` as the
  inclusion of `sub.k`; SecantusDB 0.7.0b3 computes the literal document `{"k": 1}` instead.
  django-mongodb-backend projects every field read across a join that way (Django's permission
  check reads `content_type__app_label` so: every app label came back as 1, and every staff
  user lacked every permission). Such specs are rewritten to the dotted form MongoDB treats as
  the same, before SecantusDB reads them.

Run as `python -m harness.secantus_server --host ... --port ... --storage-path :memory:`."""
from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any


def _is_inclusion_tree(value: Any) -> bool:
    return (isinstance(value, Mapping) and bool(value)
            and all(not str(key).startswith("$") and (item in (0, 1, True, False) or _is_inclusion_tree(item))
                    for key, item in value.items()))


def dotted(spec: Mapping[str, Any]) -> dict[str, Any]:
    """`{"a": {"b": 1, "c": {"d": 1}}, "e": 1}` -> `{"a.b": 1, "a.c.d": 1, "e": 1}`."""
    flat: dict[str, Any] = {}
    for key, value in spec.items():
        if not str(key).startswith("$") and _is_inclusion_tree(value):
            for sub, item in dotted(value).items():
                flat[f"{key}.{sub}"] = item
        else:
            flat[key] = value
    return flat


def main() -> int:
    import secantus.aggregate
    from secantus.cli import main as secantusd

    project_one = secantus.aggregate._project_one
    secantus.aggregate._project_one = lambda doc, spec, vars: project_one(doc, dotted(spec), vars)
    sys.argv[0] = "secantusd-py"
    return secantusd()


if __name__ == "__main__":
    sys.exit(main())
