"""``python -m benchmarks.sweep``: see ``benchmarks.sweep.run``."""

import sys

from .run import main

sys.exit(main())
