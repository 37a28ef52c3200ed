"""`python -m cem` and the `cem` command."""

import sys


def run() -> int:
    """The `cem` command (`cem.cli.main`), with a Ctrl-C while its modules load one line, as during a command."""
    try:
        from .cli import main
    except KeyboardInterrupt:
        sys.stderr.write("cem: error: interrupted (Ctrl-C)\n")
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(run())
