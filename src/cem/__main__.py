import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line loads: one line, as during a command
    sys.stderr.write("cem: error: interrupted (Ctrl-C)\n")
    sys.exit(130)

sys.exit(main())
