"""`python -m cem` and the `cem` command."""

import _signal  # the first statement: built in and loaded with the interpreter, so nothing runs before SIGINT is held

_UNHELD = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT}) if hasattr(_signal, "pthread_sigmask") else None

import sys  # noqa: E402 - after the hold: a Ctrl-C from here on waits for `run`


def run() -> int:
    """The `cem` command (`cem.cli.main`), with a Ctrl-C while its modules load one line, as during a command (held
    from this module's first statement until torch is loaded: a KeyboardInterrupt inside an import can leave a module
    half made, which a later import then trips on); once the command is over, a Ctrl-C while the interpreter exits
    (joining threads and worker processes) is ignored: the exit code stays the command's, not a death by SIGINT
    without a word."""
    try:
        import torch  # noqa: F401 - what `cem.cli.build_parser` loads first, for seconds

        from .cli import main

        if _UNHELD is not None:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, _UNHELD)  # a Ctrl-C held meanwhile is raised here
        code = main()
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # Python puts back the default (death by SIGINT) for a handler of its own as it exits
    except KeyboardInterrupt:
        sys.stderr.write("cem: error: interrupted (Ctrl-C)\n")
        return 130
    return code


if __name__ == "__main__":
    sys.exit(run())
