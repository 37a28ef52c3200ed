"""`python -m cem` and the `cem` command."""

import _signal  # the first statement: built in and loaded with the interpreter, so nothing runs before SIGINT is held

_UNHELD = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT}) if hasattr(_signal, "pthread_sigmask") else None

import _thread  # noqa: E402 - after the hold: a Ctrl-C from here on waits for `run`
import sys  # noqa: E402


class _Resend:
    """`sys.unraisablehook` for the command: a Ctrl-C (or SIGTERM) that lands in a finalizer (a `__del__`, a weakref
    callback: run wherever garbage is collected), where Python can only print it ("Exception ignored in ...") and go
    on, is sent again once out of it, to stop the command with its one line. A thread of its own sends it: one sent
    from the hook would be raised in the hook, but that thread needs the GIL, which this one keeps until it is out."""

    def __init__(self, terminated: type):
        self.terminated, self.signum, self.go = terminated, _signal.SIGINT, _thread.allocate_lock()
        self.go.acquire()
        _thread.start_new_thread(self._send, ())

    def _send(self) -> None:
        while True:
            self.go.acquire()
            _thread.interrupt_main(self.signum)  # nothing once the command is over (SIG_IGN)

    def __call__(self, unraisable) -> None:
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):
            return sys.__unraisablehook__(unraisable)
        self.signum = _signal.SIGTERM if issubclass(unraisable.exc_type, self.terminated) else _signal.SIGINT
        while True:
            try:
                if self.go.locked():
                    self.go.release()
                return None
            except KeyboardInterrupt:  # sent already, and raised here (this thread lost the GIL meanwhile): again
                continue


def run() -> int:
    """The `cem` command (`cem.cli.main`), with a Ctrl-C while its modules load one line, as during a command (held
    from this module's first statement until the parser is made, which loads torch, the layers, the model and the
    trainer, for seconds: a KeyboardInterrupt inside an import can leave a module half made, which a later import
    then trips on, or come out of torch's as another error, or abort); once the command is over, a Ctrl-C while the
    interpreter exits (joining threads and worker processes) is ignored: the exit code stays the command's, not a
    death by SIGINT without a word."""
    try:
        from .cli import Terminated, build_parser, main

        parser = build_parser()
        sys.unraisablehook = _Resend(Terminated)
        if _UNHELD is not None:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, _UNHELD)  # a Ctrl-C held meanwhile is raised here
        code = main(parser=parser)
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # Python puts back the default (death by SIGINT) for a handler of its own as it exits
    except KeyboardInterrupt:
        sys.stderr.write("cem: error: interrupted (Ctrl-C)\n")
        return 130
    return code


if __name__ == "__main__":
    sys.exit(run())
