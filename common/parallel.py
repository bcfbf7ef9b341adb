"""Process pools for the data-preparation tools.

Workers come from a fork server, not from a fork of the caller: forking a process in which torch has
already run (a test session, a notebook) can deadlock the children on locks held by torch's threads.
Each worker is single-threaded (one process per core), torch included where a worker uses it.
"""

import multiprocessing
import sys


def _single_threaded():
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def process_pool(jobs):
    """A ``multiprocessing.Pool`` of ``jobs`` (at least 1) fork-server workers, single-threaded.

    Functions given to it must be importable (module level), as with the spawn start method.
    """
    context = multiprocessing.get_context("forkserver")
    return context.Pool(max(1, jobs), initializer=_single_threaded)
