"""Atomic file writes: write under a temporary name in the same folder, then rename.

A reader (or a rerun after kill -9) sees either the old file or the complete new one, never a part.
"""

import contextlib
import glob
import logging
import os

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path``; rename it onto ``path`` when the block succeeds.

    >>> with atomic_path("out.json") as tmp:          # doctest: +SKIP
    ...     open(tmp, "w").write("{}")
    """
    temporary = f"{path}.tmp{os.getpid()}"
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def atomic_write_text(path, text):
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as temporary:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)


def remove_temporaries(path):
    """Delete what killed runs left of unfinished atomic writes: the temporaries (``NAME.tmp<pid>``)
    of the file ``path``, or of every file in ``path`` when it is a folder. Returns their paths."""
    pattern = os.path.join(glob.escape(path), "*") if os.path.isdir(path) else glob.escape(path)
    stale = glob.glob(pattern + ".tmp[0-9]*")
    for leftover in stale:
        logger.info("removing %s, left by an interrupted run", leftover)
        os.remove(leftover)
    return stale
