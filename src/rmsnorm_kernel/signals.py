"""What SIGINT (Ctrl+C) and SIGTERM do, everywhere in the project: the one module that installs their
handlers. Every abnormal end by a signal is one line and exit status 128 + the signal (130, 143).

- While a command starts (importing torch takes seconds): one line and the status at once (``guard``).
- While a check command or a benchmark runs: SIGINT raises ``KeyboardInterrupt`` and SIGTERM
  ``Terminated``, so that ``finally`` blocks run on the way out; once the command has decided its exit
  status, later signals are ignored (``command_takes_over``).
- While the sweep measures: the signal asks it to stop after the point in progress
  (``stop_after_current``).
- A training run: at once (``Stopped``) outside training (``stop_the_command``); while training, SIGTERM
  is held and handed to Lightning at the end of the step, SIGINT acting as SIGTERM, so that the run stops
  with ``last.ckpt`` written (``SigtermHold``, ``sigint_as_sigterm``, ``sigterm_recorded``).

Handlers are installed in the main thread only, where Python runs them. A signal the process was started
ignoring (SIGINT in a shell's background job) stays ignored while a command starts. Standard library
only: the package imports this module before torch, for the start-up guard.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

BOTH = (signal.SIGINT, signal.SIGTERM)


def in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def exit_status(name: str) -> int:
    """The exit status of a process stopped by the signal ``name`` (``SIGINT``: 130, ``SIGTERM``: 143)."""
    return 128 + signal.Signals[name].value


# --------------------------------------------------------------------------------------------------
# While a command starts


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
    if in_main_thread():
        handler = _stopped_while_starting(prog)
        for s in BOTH:
            if signal.getsignal(s) is not signal.SIG_IGN:
                signal.signal(s, handler)


def guard_if_command() -> None:
    """``guard`` while Python locates the module of ``python -m <module>`` (the package's import then:
    ``sys.argv[0] == "-m"`` only then), before it imports torch: ``python -m rmsnorm_kernel ...`` and
    ``python -m benchmarks.<name>``."""
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
    return any(guarding(signal.getsignal(s)) for s in BOTH)


# --------------------------------------------------------------------------------------------------
# While a check command or a benchmark runs


class Terminated(BaseException):
    """SIGTERM arrived while a command ran (raised in the main thread, as Ctrl+C raises KeyboardInterrupt)."""


def _raise_terminated(signum, frame):
    raise Terminated()


def command_takes_over() -> Callable[[], None]:
    """The signals of a command whose work starts now: Ctrl+C raises ``KeyboardInterrupt`` (back from
    ``guard``), SIGTERM ``Terminated``. Returns ``done``, to call once the work has decided the exit
    status: in a command, later signals are then ignored, so that one arriving while Python shuts down
    cannot replace that status; elsewhere (a test calling a command's ``main``), SIGTERM's handler is put
    back as it was. A signal that arrives while ``done`` runs is ignored the same way."""
    in_main = in_main_thread()
    command = in_main and guarded()
    if command and guarding(signal.getsignal(signal.SIGINT)):  # Ctrl+C back to Python
        signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    if previous is None:  # a handler installed outside Python: put the default back afterwards
        previous = signal.SIG_DFL

    def after() -> None:
        if command:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        elif in_main:
            signal.signal(signal.SIGTERM, previous)

    def done() -> None:
        try:
            after()
        except (KeyboardInterrupt, Terminated):  # arrived as the status was decided: that status stands
            after()

    return done


@contextlib.contextmanager
def stop_after_current():
    """SIGINT (Ctrl+C) and SIGTERM ask for a stop at the next safe point rather than interrupting whatever
    runs (an import, a compile, a timing). Yields a callable giving the signal's name once one arrived
    (None before). A second signal acts as it would without this. Put back after."""
    received: list[str] = []
    if not in_main_thread():
        yield lambda: None
        return
    previous = {s: signal.getsignal(s) for s in BOTH}

    def handler(signum, frame):
        received.append(signal.Signals(signum).name)
        for s, h in previous.items():
            signal.signal(s, h)

    for s in previous:
        signal.signal(s, handler)
    try:
        yield lambda: received[0] if received else None
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# --------------------------------------------------------------------------------------------------
# A training run


class Stopped(BaseException):
    """SIGINT or SIGTERM where a run stops at once (set-up, its first training step and the compilation
    in it, the final test, the summary): raised where the process is, so that it ends with one line. A
    ``BaseException``: no job runner or library handler takes it for a failure of its own and carries on."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


@contextlib.contextmanager
def stop_the_command():
    """SIGINT and SIGTERM raise ``Stopped``. While training, ``sigint_as_sigterm`` and Lightning's SIGTERM
    handling replace them, and ``sigterm_recorded`` leaves SIGTERM to Lightning alone; both are put back
    after."""
    if not in_main_thread():
        yield
        return

    def handler(signum, frame):
        raise Stopped(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in BOTH}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class SigtermHold:
    """SIGTERM held while a training step (and its validation) runs, and handed to Lightning's handler
    once the step is over, so that the run stops at a step's end with its checkpoint written.

    Until the first training step has ended (``at_once``), a signal stops the run at once (``Stopped``):
    Lightning's set-up, the sanity check and the first step, which compiles the network under
    compile=true, can take long, and they hold nothing a checkpoint would keep. ``signal_name`` is the
    signal that came (``sigint_as_sigterm`` turns SIGINT into SIGTERM); ``late`` a signal Lightning's
    loops no longer act on (``outside_hold``).
    """

    def __init__(self) -> None:
        self.signal_name = "SIGTERM"  # sigint_as_sigterm says when it was SIGINT
        self.at_once = True
        self.late: str | None = None
        self._handler = None  # the SIGTERM handler held back
        self._held: int | None = None
        self._stopping = False  # a held signal went to Lightning: later ones stay held to the end

    def _name(self, signum: int) -> str:
        return self.signal_name if signum == signal.SIGTERM else signal.Signals(signum).name

    def outside_hold(self, signum, frame) -> None:
        """SIGTERM's handler around ``Trainer.fit`` and the run's end (``sigterm_recorded``), which
        Lightning's handler also calls: the signal is recorded in ``late``. A signal Lightning acts on stops
        the run at its step's end; one that comes after its loops' last check (in ``on_train_end``, or once
        ``Trainer.fit`` has returned) is honoured once the run's end files are written."""
        if self.late is None:
            self.late = self._name(signum)
        if self.at_once:
            raise Stopped(self._name(signum))

    @property
    def holding(self) -> bool:
        return self._handler is not None

    @property
    def held(self) -> bool:
        """Whether a SIGTERM came while held and was not handed over yet."""
        return self._held is not None

    def hold(self) -> None:
        """From now on SIGTERM is recorded, not handled (main thread only: Python runs handlers there)."""
        if self._handler is not None or not in_main_thread():
            return

        def hold(signum, frame):
            self._held = signum  # kept also when raised at once: code that swallows the exception ends its step
            if self.at_once:
                raise Stopped(self._name(signum))

        self._held = None
        self._handler = signal.signal(signal.SIGTERM, hold)

    def hand_over(self, stop: bool, end_hold: bool) -> None:
        """With ``stop`` (every process agreed that one of them holds a signal), hand one to the handler
        held back (Lightning's: it stops the run at this step's end), once, and keep holding any later one;
        else, with ``end_hold``, put the held-back handler back."""
        if self._handler is None:
            return
        if stop:
            self._held, self._stopping = None, True
            if callable(self._handler):
                self._handler(signal.SIGTERM, None)
            else:  # no handler of Lightning's (the default action, or ignored): as if never held
                signal.signal(signal.SIGTERM, self._handler)
                self._handler = None
                os.kill(os.getpid(), signal.SIGTERM)
            return
        if end_hold:
            self.release()

    def release(self) -> None:
        """The held-back handler back in place."""
        if self._handler is not None:
            signal.signal(signal.SIGTERM, self._handler)
            self._handler = None

    def release_unless_stopping(self) -> None:
        """On an exception: the held-back handler back, unless a held signal was handed over (the run is
        stopping by it, and later ones stay held to the end)."""
        if not self._stopping:
            self.release()


#: The logger of Lightning's SIGTERM handling, which announces each signal it is handed as
#: ``Received SIGTERM: 15``.
LIGHTNING_SIGNAL_LOGGER = "lightning.pytorch.trainer.connectors.signal_connector"


class SignalNamed(logging.Filter):
    """Lightning announces every signal it is handed as SIGTERM; Ctrl+C reaches it as one
    (``sigint_as_sigterm``). This filter gives the announcement the signal that came."""

    def __init__(self, hold: SigtermHold) -> None:
        super().__init__()
        self.hold = hold

    def filter(self, record: logging.LogRecord) -> bool:
        name = self.hold.signal_name
        message = record.getMessage()
        sigterm = f"Received SIGTERM: {signal.SIGTERM.value}"
        if name != "SIGTERM" and sigterm in message:
            record.msg, record.args = message.replace(sigterm, f"Received {name}: {signal.Signals[name].value}"), ()
        return True


@contextlib.contextmanager
def sigint_as_sigterm(hold: SigtermHold):
    """While training, SIGINT (Ctrl+C) stops the run as SIGTERM does: at the end of the current step,
    with ``last.ckpt`` written, rather than by ``KeyboardInterrupt`` wherever the interpreter happens to
    be (mid-step, mid-write); before the first step's end, at once (``Stopped``)."""
    if not in_main_thread():
        yield
        return

    def handler(signum, frame):
        if hold.at_once:
            raise Stopped("SIGINT")
        hold.signal_name = "SIGINT"
        os.kill(os.getpid(), signal.SIGTERM)

    named = SignalNamed(hold)
    lightning_log = logging.getLogger(LIGHTNING_SIGNAL_LOGGER)
    lightning_log.addFilter(named)
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        lightning_log.removeFilter(named)


@contextlib.contextmanager
def sigterm_recorded(hold: SigtermHold):
    """While training and until the run's end files are written, SIGTERM is Lightning's and ``hold``'s:
    Lightning also calls a handler it finds in place, and the command's own (``stop_the_command``) would
    stop the step, or the end's writes, where they are. The handler in place records the signal
    (``SigtermHold.outside_hold``). Put back after."""
    if not in_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, hold.outside_hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
