"""The ``gptzoo`` command's entry point (the console script and ``python -m gptzoo``).

It imports the command line, and with it torch, inside a Ctrl-C handler, so an interrupt while
torch loads is the same one line and exit status 130 as one during the command; once the command
has returned, Ctrl-C is ignored while the interpreter shuts down (the work is done).
"""

import signal
import sys


def main() -> int:
    try:
        from gptzoo.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: nothing was done\n")
        if "--json" in sys.argv[1:]:
            sys.stdout.write('{\n  "error": "interrupted: nothing was done",\n  "exit": 130\n}\n')
        return 130
    code = run()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    sys.exit(main())
