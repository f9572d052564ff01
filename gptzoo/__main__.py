"""The ``gptzoo`` command's entry point (the console script and ``python -m gptzoo``).

It imports the command line, and with it torch, inside a Ctrl-C handler, so an interrupt while
torch loads is the same one line and exit status 130 as one during the command; once the command
has returned, Ctrl-C while the interpreter shuts down (waiting for a plugin's thread, say) leaves at
once with the command's own status: the work is done.
"""

import os
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

    def leave(signum: int, frame: object) -> None:  # the work is done: Ctrl-C only stops the shutdown
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(code)

    signal.signal(signal.SIGINT, leave)
    return code


if __name__ == "__main__":
    sys.exit(main())
