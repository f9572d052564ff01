"""The ``gptzoo`` command's entry point (the console script and ``python -m gptzoo``).

It imports the command line inside a Ctrl-C handler, so an interrupt while it loads is the same one
line and exit status 130 as one during the command (which imports torch, when it needs it, inside
its own handler); once the command has returned, Ctrl-C while the interpreter shuts down (waiting
for a plugin's thread, say) leaves at once with the command's own status, and once only modules are
left to unload it is ignored: the work is done. What is alive then is frozen out of the shutdown's
garbage collections (:func:`gc.freeze`).
"""

import atexit
import gc
import json
import os
import signal
import sys


def main() -> int:
    try:
        from gptzoo.cli import main as run

        code = run()  # it reports a Ctrl-C during the command itself, saying what was kept
    except KeyboardInterrupt:  # while the command line loads, or before the command started
        message = "interrupted: nothing was done"
        sys.stderr.write(message + "\n")
        if "--json" in sys.argv[1:]:  # the document gptzoo.cli writes for an error
            sys.stdout.write(json.dumps({"error": message, "exit": 130}, indent=2) + "\n")
        return 130

    def leave(signum: int, frame: object) -> None:  # the work is done: Ctrl-C only stops the shutdown
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(code)

    signal.signal(signal.SIGINT, leave)
    # atexit runs after the wait for other threads and before Python puts the default Ctrl-C action back
    # to unload its modules (torch takes a while); an ignored Ctrl-C stays ignored (for every thread) until
    # the process is gone.
    atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)
    # The work is done and what is alive now lives until the exit: frozen, it is left out of the garbage
    # collections of the interpreter's shutdown (once torch is loaded, a million objects and a third of a
    # second). Shutdown still frees what the modules' teardown releases; cycles are left to the system.
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(main())
