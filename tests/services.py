"""Which environment the tests run in (no Django imports: conftest loads this early)."""
import os

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
