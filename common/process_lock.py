"""The process lock of an output folder (``run.lock``, the writer's pid): two runs never write one folder.

Not to be confused with ``lock.json`` (``common.fingerprint``), the record of an experiment's inputs.
"""

import atexit
import os

from common.user_errors import UserError

PROCESS_LOCK_FILE = "run.lock"  # the pid of the process writing the folder


class FolderInUse(UserError, RuntimeError):
    """The folder is being written by another live process."""


def acquire_process_lock(folder):
    """Marks ``folder`` as used by this process, so a second run cannot write into it too.

    A lock left by a process that no longer runs is taken over. Released at exit.
    """
    path = os.path.join(folder, PROCESS_LOCK_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            holder = int(f.read().strip() or 0)
        os.kill(holder, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        holder = None
    if holder is not None and holder != os.getpid():
        raise FolderInUse(
            f"{folder} is in use by process {holder} ({path}): wait for it to finish, "
            "or give another folder (output_folder of a recipe)"
        )
    with open(path, "w", encoding="utf-8") as f:
        f.write(str(os.getpid()))
    atexit.register(lambda: os.path.exists(path) and os.remove(path))
