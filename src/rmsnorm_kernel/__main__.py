"""``python -m rmsnorm_kernel <command>``: see ``rmsnorm_kernel.cli``."""

from .cli import main

raise SystemExit(main())
