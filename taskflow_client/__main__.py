"""``python -m taskflow_client``: see `taskflow_client.cli`."""
import sys

from .cli import main

sys.exit(main())
