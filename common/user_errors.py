"""Errors the user fixes, and how every command ends on one: its message on stderr, exit status 2, no
traceback.

A config key or value, inputs changed under a resume, a missing file, a refused shard folder: the
message names the file, key or value and the fix, so a stack of library frames above it only hides it.
Every command's ``__main__`` runs through ``run_command``::

    if __name__ == "__main__":
        run_command(main, sys.argv[1:])

``TANDEM_DEBUG=1`` in the environment lets the error propagate, stack and all (SpeechBrain's own
``--debug`` flag already means a short debugging run).
"""

import os
import sys

DEBUG_VARIABLE = "TANDEM_DEBUG"
EXIT_USER_ERROR = 2


class UserError(Exception):
    """An error in what the user gave (config, command line, data); the message says the fix."""


class UserValueError(UserError, ValueError):
    """A value the user gave (a setting, a path's contents) that cannot work, with the fix."""


USER_ERRORS = (UserError, FileNotFoundError)  # a missing file is named by the path the user gave


def debugging():
    """Whether ``TANDEM_DEBUG`` asks for the stack of user errors."""
    return os.environ.get(DEBUG_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def run_command(main, argv=None, cleanup=None):
    """Runs ``main(argv)`` (``main()`` without ``argv``) and exits with its return status; a user error
    prints ``error: <message>`` on stderr and exits 2 without a traceback, unless ``debugging()``.
    ``cleanup`` (e.g. leaving the DDP group) runs either way."""
    try:
        status = main() if argv is None else main(argv)
    except USER_ERRORS as error:
        if debugging():
            raise
        print(f"error: {error}", file=sys.stderr)
        status = EXIT_USER_ERROR
    finally:
        if cleanup is not None:
            cleanup()
    sys.exit(status)
