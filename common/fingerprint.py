"""``lock.json``: what an experiment was made from, and a resume that refuses changed inputs.

Every run of a recipe's ``train.py`` writes ``lock.json`` in its experiment folder: the sha256 of each
input file it reads (shard parquets, tokenizer, units, k-means model, pretrained checkpoint; a folder by
the sha256 of each of its files, listed under ``files`` with their size and mtime, so the next run hashes
again only the files whose size or mtime changed), the code commit and whether the working tree had
changes, the versions of the packages that shape the model, the world size and loader workers, and
the config's settings (every plain value after overrides: ``settings``).

When the folder already holds checkpoints, the new run compares first: a changed input stops it
before any work, naming each change (a resumed model would otherwise continue on other data or
another tokenizer's ids), unless ``--force_resume=True``; another world size or worker count is
logged with how the loader replans (the next epoch's batches are planned anew; the epoch under way
continues at its position); a changed setting (``--number_of_epochs`` to train on, but also speed
perturbation, masks or rates that would silently change what the resumed model learns) is logged,
naming each value before and after. The lock is then rewritten for this run.
"""

import hashlib
import importlib.metadata
import json
import logging
import os
import subprocess

from common.atomic import atomic_write_text
from common.user_errors import UserError

logger = logging.getLogger(__name__)

LOCK_FILE = "lock.json"
PACKAGES = ("torch", "torchaudio", "speechbrain", "sentencepiece", "numpy")
FORCE_FLAG = "--force_resume"
EVALUATION_KEYS = ("test_parquets", "lm_dir")  # what only decoding reads: free to change between runs


class ChangedInputs(UserError, RuntimeError):
    """A resume whose inputs differ from the ones the experiment's checkpoints were trained on."""


def sha256_of(path, chunk=1 << 20):
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_files(path, cache=None):
    """``{relative path: {"size", "mtime_ns", "sha256"}}`` of every file under the folder ``path``; a file
    whose size and mtime are those ``cache`` (the same mapping, of an earlier run) holds keeps its sha256
    unread."""
    files, cache = {}, cache or {}
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            relative, stat = os.path.relpath(full, path), os.stat(full)
            known = cache.get(relative) or {}
            same = (known.get("size"), known.get("mtime_ns")) == (stat.st_size, stat.st_mtime_ns)
            files[relative] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                               "sha256": known["sha256"] if same and "sha256" in known else sha256_of(full)}
    return files


def fingerprint(path, cached=None):
    """``{"path", "sha256"}`` of a file; of a folder also ``files`` (``folder_files``, reusing those of
    ``cached``, the same entry of an earlier lock, when it names the same folder), its sha256 then over
    the files' relative paths and contents."""
    if not os.path.isdir(path):
        return {"path": path, "sha256": sha256_of(path)}
    same_folder = cached and os.path.abspath(cached.get("path", "")) == os.path.abspath(path)
    files = folder_files(path, cached.get("files") if same_folder else None)
    digest = hashlib.sha256("".join(f"{name}\t{entry['sha256']}\n" for name, entry in files.items()).encode())
    return {"path": path, "sha256": "dir:" + digest.hexdigest(), "files": files}


def input_hashes(hparams, keys, previous=None):
    """``{"key" or "key[i]": fingerprint}`` of the files and folders under ``keys`` (None skipped);
    ``previous`` (an earlier lock's ``inputs``) spares hashing a folder's unchanged files again."""
    hashes, previous = {}, previous or {}
    for key in keys:
        value = hparams.get(key)
        paths = value if isinstance(value, (list, tuple)) else [value]
        for index, path in enumerate(paths):
            if path is None:
                continue
            name = key if not isinstance(value, (list, tuple)) else f"{key}[{index}]"
            hashes[name] = fingerprint(str(path), previous.get(name))
    return hashes


def code_state(folder):
    """``{"commit": sha or None, "dirty": bool or None}`` of the git checkout holding ``folder``."""
    def git(*args):
        return subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True, timeout=10)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        status = git("status", "--porcelain", "--untracked-files=no")
        return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}


def package_versions():
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def plain(value):
    """A yaml scalar as a JSON value (ruamel's scalar types become bool / int / float / str)."""
    for kind in (bool, int, float):  # bool first: a bool is an int
        if isinstance(value, kind):
            return kind(value)
    return None if value is None else str(value)


def config_settings(values, skip=()):
    """``{"block.key": value}`` of a config's resolved values (``common.recipe.preview_config``): plain
    maps are walked, a list of scalars is one value; tagged nodes (``!new:``, ``!apply:`` objects, whose
    arguments are ``!ref`` s to the settings), ``__`` keys and top-level keys in ``skip`` are left out."""
    settings = {}

    def walk(node, name):
        if getattr(getattr(node, "tag", None), "value", None) or name.rsplit(".", 1)[-1].startswith("__"):
            return
        if isinstance(node, dict):
            for key, child in node.items():
                walk(child, f"{name}.{key}" if name else str(key))
        elif isinstance(node, (list, tuple)) and any(isinstance(child, (dict, list, tuple)) for child in node):
            for index, child in enumerate(node):
                walk(child, f"{name}[{index}]")
        elif isinstance(node, (list, tuple)):
            settings[name] = [plain(child) for child in node]
        else:
            settings[name] = plain(node)

    walk({key: value for key, value in values.items() if key not in skip}, "")
    return settings


def read_lock(folder):
    """The folder's ``lock.json`` as a dict, or None when it has none."""
    path = os.path.join(folder, LOCK_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def make_lock(hparams, input_keys, world_size, workers, config_file, settings=None, previous=None):
    """The lock of this run (see the module docstring); ``settings`` from ``config_settings``; ``previous``
    the folder's earlier lock (``read_lock``), whose folder fingerprints spare rehashing unchanged files."""
    repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    inputs = input_hashes(hparams, input_keys, (previous or {}).get("inputs"))
    return {"config": config_file, "inputs": inputs, "code": code_state(repository),
            "packages": package_versions(), "world_size": world_size, "loader_workers": workers,
            "settings": settings or {}}


def changed_settings(old, new):
    """Lines naming each setting whose value differs between two locks' ``settings``."""
    missing = "(not set)"
    return [f"{key}: {old.get(key, missing)} -> {new.get(key, missing)}"
            for key in sorted(set(old) | set(new)) if old.get(key, missing) != new.get(key, missing)]


def changed_inputs(old, new):
    """Lines naming each training input both locks list whose file differs (for a folder: which of its
    files changed, came or went)."""
    lines = []
    for key in sorted(set(old["inputs"]) & set(new["inputs"])):
        if key.split("[")[0] in EVALUATION_KEYS:
            continue
        before, after = old["inputs"][key], new["inputs"][key]
        if before["sha256"].startswith("dir:") and "files" not in before:
            logger.info("%s: the earlier lock fingerprinted %s by file names and sizes: not compared; "
                        "from now on by contents", key, before["path"])
            continue
        if before["sha256"] != after["sha256"]:
            lines.append(f"{key}: {after['path']} differs from the {'folder' if 'files' in after else 'file'} the "
                         f"checkpoints were trained on ({before['path']}, sha256 {before['sha256'][:16]} -> "
                         f"{after['sha256'][:16]}){changed_files(before.get('files'), after.get('files'))}")
    return lines


def changed_files(before, after):
    """``": changed a, b; new c; gone d"`` of two folder fingerprints' ``files`` ('' for files)."""
    if before is None or after is None:
        return ""
    parts = [(what, [name for name in names if condition(name)]) for what, names, condition in (
        ("changed", sorted(set(before) & set(after)), lambda n: before[n]["sha256"] != after[n]["sha256"]),
        ("new", sorted(set(after) - set(before)), bool), ("gone", sorted(set(before) - set(after)), bool))]
    return ": " + "; ".join(f"{what} {', '.join(names)}" for what, names in parts if names)


def check_and_write_lock(folder, lock, has_checkpoints, force=False, write=True, training=True):
    """Compare ``lock`` with the folder's previous one when it has checkpoints (``check_resume``), then
    write it (``write``: the main process); inputs this run does not read (the training data of a
    decoding-only run) are kept, and so are the training run's world size and workers when this run
    does not train."""
    path = os.path.join(folder, LOCK_FILE)
    old = read_lock(folder)
    if old is not None and has_checkpoints:
        check_resume(old, lock, folder, force, training)
    if old is not None:
        lock = {**lock, "inputs": {**old.get("inputs", {}), **lock["inputs"]}}
        if not training:  # a decoding run keeps what the checkpoints were trained with
            lock.update({key: old[key] for key in ("world_size", "loader_workers", "settings") if key in old})
    if write:
        atomic_write_text(path, json.dumps(lock, indent=2, sort_keys=True) + "\n")


def check_resume(old, lock, folder, force, training=True):
    """Raise ChangedInputs for changed training inputs (unless ``force``: then a warning); when
    ``training``, log changed settings, and a changed world size or worker count with how the loader
    replans."""
    changes = changed_inputs(old, lock)
    if changes and not force:
        raise ChangedInputs(f"{folder} holds checkpoints trained on other inputs:\n  " + "\n  ".join(changes)
                            + f"\nuse another output folder, put the inputs back, or pass {FORCE_FLAG}=True "
                            "to continue the old model on the new inputs")
    if changes:
        logger.warning("%s=True: continuing on changed inputs: %s", FORCE_FLAG, "; ".join(changes))
    settings = changed_settings(old.get("settings", {}), lock.get("settings", {})) if "settings" in old else []
    if training and settings:
        logger.warning("resuming with settings changed since the last run (the checkpoints continue "
                       "under the new values): %s", "; ".join(settings))
    for key, what in (("world_size", "ranks"), ("loader_workers", "loader workers per rank")):
        if training and old.get(key) != lock[key]:
            logger.warning("resuming with %s %s instead of %s: the epoch under way keeps its plan position, "
                           "the next epochs are planned for %s", lock[key], what, old.get(key), lock[key])


def pop_force_flag(argv):
    """``(argv without --force_resume=..., whether it was True)``."""
    force, kept = False, []
    for arg in argv:
        if arg.startswith(FORCE_FLAG + "="):
            force = arg.split("=", 1)[1].strip().lower() in ("true", "1", "yes")
        else:
            kept.append(arg)
    return kept, force
