"""`python -m cem` and the `cem` command."""

import contextlib
import signal
import sys


@contextlib.contextmanager
def _held(sig: int):
    """`sig` blocked meanwhile and delivered after (where there is pthread_sigmask)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def run() -> int:
    """The `cem` command (`cem.cli.main`), with a Ctrl-C while its modules load one line, as during a command (held
    until torch is loaded: a KeyboardInterrupt inside an import can leave a module half made, which a later import
    then trips on); once the command is over, a Ctrl-C while the interpreter exits (joining threads and worker
    processes) is ignored: the exit code stays the command's, not a death by SIGINT without a word."""
    try:
        with _held(signal.SIGINT):
            import torch  # noqa: F401 - what `cem.cli.build_parser` loads first, for seconds

            from .cli import main
        code = main()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Python puts back the default (death by SIGINT) for a handler of its own as it exits
    except KeyboardInterrupt:
        sys.stderr.write("cem: error: interrupted (Ctrl-C)\n")
        return 130
    return code


if __name__ == "__main__":
    sys.exit(run())
