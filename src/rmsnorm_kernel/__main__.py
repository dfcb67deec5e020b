"""``python -m rmsnorm_kernel <command>``: see ``rmsnorm_kernel.checks.main``."""

from .checks.main import main

raise SystemExit(main())
