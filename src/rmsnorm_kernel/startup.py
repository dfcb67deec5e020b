"""Ctrl+C or SIGTERM while a command is still starting (importing torch takes seconds): one line and exit
status 130 or 143, not a traceback from inside an import, nor a silent end.

``guard(prog)`` installs that for both signals; the package calls it on import when Python is locating
the module of a ``python -m`` command (``sys.argv[0] == "-m"`` only then), before it imports torch, so
it covers ``python -m rmsnorm_kernel ...`` and ``python -m benchmarks.<name>``. Standard library only:
nothing heavy may be imported before it. ``checks.cli.run_interruptible`` takes the signals over when the
command's work starts, and once that work has decided the exit status, a late signal (while Python shuts
down) is ignored, so that the status stays the one the command decided (``guarding``)."""

from __future__ import annotations

import os
import signal
import sys
import threading


def _stopped_while_starting(prog: str):
    def handler(signum, frame):
        name = signal.Signals(signum).name
        print(f"{prog}: stopped by {name} while starting; nothing was done", file=sys.stderr, flush=True)
        # At once, not by SystemExit: raised inside an import, some library code swallows it and starts
        # the command anyway; and before the command's work there is nothing to clean up.
        os._exit(128 + signum)

    handler.startup_guard = True
    return handler


def guard(prog: str) -> None:
    """Until a command's work starts: SIGINT and SIGTERM end it with one line naming ``prog``. A signal
    the process was started ignoring (SIGINT in a shell's background job) stays ignored."""
    if threading.current_thread() is threading.main_thread():
        handler = _stopped_while_starting(prog)
        for s in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(s) is not signal.SIG_IGN:
                signal.signal(s, handler)


def guard_if_command() -> None:
    """``guard`` while Python locates the module of ``python -m <module>`` (the package's import then)."""
    if sys.argv[:1] == ["-m"]:
        words = getattr(sys, "orig_argv", [])
        module = words[words.index("-m") + 1] if "-m" in words[:-1] else "a module"
        guard(f"python -m {module}")


def guarding(handler) -> bool:
    """Whether ``handler`` is one that ``guard`` installed."""
    return getattr(handler, "startup_guard", False)


def guarded() -> bool:
    """Whether ``guard`` holds a signal: the process is a command that has not started its work (not a
    test calling a command's ``main``)."""
    return any(guarding(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM))
