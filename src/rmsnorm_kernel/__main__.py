"""``python -m rmsnorm_kernel <command>``: see ``rmsnorm_kernel.checks.cli``."""

from .checks.cli import main

raise SystemExit(main())
