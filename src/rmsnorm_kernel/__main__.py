"""``python -m rmsnorm_kernel <command>``: see ``rmsnorm_kernel.verify.cli``."""

from .verify.cli import main

raise SystemExit(main())
