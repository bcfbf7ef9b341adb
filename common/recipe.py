"""What every ``train.py`` does before training: read the command line, check and load the
config, set up DDP, and create the experiment folder.

Usage in a recipe::

    if __name__ == "__main__":
        hparams, run_opts = prepare_experiment(sys.argv[1:])
        brain = ASR(modules=..., hparams=hparams, run_opts=run_opts, ...)
        ...
        end_distributed()

with ``python train.py hparams/X.yaml --key=value ...``. Config mistakes (a misspelled key,
a ``!PLACEHOLDER`` left unset, a number given as text) stop the run before any work, with
an error that names the key and the fix.
"""

import dataclasses
import datetime
import difflib
import io
import logging
import os
import re
import shlex
import sys

import ruamel.yaml
import speechbrain as sb
import torch
from hyperpyyaml import load_hyperpyyaml, resolve_references
from hyperpyyaml.core import recursive_update

from common.atomic import atomic_write_text
from common.fingerprint import (
    EVALUATION_KEYS,
    check_and_write_lock,
    config_settings,
    make_lock,
    pop_force_flag,
    read_lock,
)
from common.process_lock import acquire_process_lock
from common.user_errors import UserValueError

logger = logging.getLogger(__name__)

BASE_KEY = "base_config"  # a derived config names its base (relative path) and lists what differs
SIZE_KEY = "model_size"  # a config names its model-size file (relative path): its keys stand in its place


class ConfigError(UserValueError):
    """A problem in the yaml config or its command-line overrides; the message says the fix."""


def read_yaml_tree(path):
    """The yaml at ``path`` as a ruamel tree: tags (!ref, !new:, !include:) kept, unresolved; a
    ``model_size`` key replaced by the size file's keys (``expand_model_size``)."""
    with open(path, encoding="utf-8") as f:
        return expand_model_size(ruamel.yaml.YAML().load(f), path)


def expand_model_size(tree, config_file):
    """``tree`` with its ``model_size: sizes.yaml`` key (relative to ``config_file``) replaced, at its
    place, by the keys of that file: one model size (recipes/hparams/model/sizes/) written once for
    every config of that size, so pretraining and finetuning of one size cannot disagree."""
    if not isinstance(tree, dict) or SIZE_KEY not in tree:
        return tree
    path = os.path.join(os.path.dirname(config_file), str(tree[SIZE_KEY]))
    if not os.path.isfile(path):
        raise ConfigError(f"{config_file}: {SIZE_KEY} {path} does not exist: fix the path (relative to the config)")
    with open(path, encoding="utf-8") as f:
        sizes = ruamel.yaml.YAML().load(f) or {}
    restated = sorted(str(key) for key in sizes if key in tree)
    if restated:
        raise ConfigError(f"{config_file} sets {', '.join(restated)} beside {SIZE_KEY}: {path}: a size is written "
                          "once: change it there, or name another size file")
    expanded = ruamel.yaml.comments.CommentedMap()
    for key, value in tree.items():
        expanded.update(sizes if key == SIZE_KEY else {key: value})
    return expanded


def open_config(path):
    """A text stream of the config at ``path`` for HyperPyYAML (its ``name`` is ``path``, so ``!include:``
    paths stay relative to it), with its ``model_size`` expanded."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    tree = ruamel.yaml.YAML().load(text)
    if isinstance(tree, dict) and SIZE_KEY in tree:
        buffer = io.StringIO()
        ruamel.yaml.YAML().dump(expand_model_size(tree, path), buffer)
        text = buffer.getvalue()
    stream = io.StringIO(text)
    stream.name = path
    return stream


def closest_key_hint(key, known_keys):
    """' Did you mean "x"?' for the most similar known key, or '' when none is close."""
    matches = difflib.get_close_matches(key, [str(k) for k in known_keys], n=1, cutoff=0.6)
    return f' Did you mean "{matches[0]}"?' if matches else ""


def scalar_kind(value):
    """"bool", "int" or "float" for plain scalars, else None (strings, tags, mappings)."""
    for kind in (bool, int, float):  # bool first: True is also an int
        if isinstance(value, kind):
            return kind.__name__
    return None


def check_value_type(key, default, value):
    """Raises ConfigError when ``value`` cannot stand where the config has ``default``.

    Only numbers and bools are checked; an int may replace a float; a tagged value (``!ref``,
    ``!new:``, ...) is checked when it resolves.
    """
    expected, given = scalar_kind(default), scalar_kind(value)
    if expected is None or given == expected or (expected, given) == ("float", "int"):
        return
    if given is None and getattr(getattr(value, "tag", None), "value", None):
        return
    raise ConfigError(
        f"--{key}={value!r} is of type {given or type(value).__name__}, but the config's "
        f"value {default!r} is of type {expected}: pass a {expected}"
    )


def check_keys(overrides, tree, where, parent=""):
    """Checks every key of ``overrides`` (nested mappings too, named ``parent[key]``) against the
    yaml ``tree``; the keys of an empty mapping of the tree are the user's."""
    for key, value in overrides.items():
        if key not in tree:
            raise ConfigError(
                f'"{key}" is not a key of {where}.{closest_key_hint(key, tree.keys())}'
            )
        default, name = tree[key], f"{parent}[{key}]" if parent else key
        if isinstance(value, dict) and isinstance(default, dict):
            if default:  # an empty mapping in the config is free-form (e.g. weights by corpus name)
                check_keys(value, default, f"{where}[{key}]", name)
        else:
            check_value_type(name, default, value)


def check_include_parameters(tree, folder, where):
    """Checks the keys passed under each ``!include:`` against the included file's keys
    (HyperPyYAML silently ignores a misspelled one)."""
    for key, node in tree.items():
        tag = getattr(getattr(node, "tag", None), "value", None) or ""
        if tag.startswith("!include:"):
            included = os.path.join(folder, tag[len("!include:"):])
            check_keys(dict(node), read_yaml_tree(included), f"{included} (included as {key})")
        elif isinstance(node, dict):
            check_include_parameters(node, folder, f"{where}[{key}]")


def resolve_derived_config(hparams_file, overrides=None):
    """``(base file, overrides)`` for a derived config, else ``(hparams_file, overrides)``.

    A derived config holds ``base_config: other.yaml`` (relative to itself) and only the keys it
    changes; they are checked against the base and applied as overrides, the command line's on top.
    Bases may be derived configs themselves.
    """
    if isinstance(overrides, str) or overrides is None:
        overrides = ruamel.yaml.YAML().load(overrides or "") or {}
    tree = read_yaml_tree(hparams_file)
    if BASE_KEY not in tree:
        return hparams_file, overrides
    base = os.path.join(os.path.dirname(hparams_file), str(tree.pop(BASE_KEY)))
    if not os.path.isfile(base):
        raise ConfigError(f"{hparams_file}: {BASE_KEY} {base} does not exist: fix the path "
                          "(relative to the derived config)")
    recursive_update(tree, overrides)
    return resolve_derived_config(base, tree)  # keys are checked against the last base on loading


def preview_config(hparams_file, overrides):
    """The config's values with references and overrides resolved, nothing built yet (``!new:`` and
    ``!apply:`` stay unresolved tags)."""
    with open_config(hparams_file) as f:
        return ruamel.yaml.YAML().load(resolve_references(f, overrides))


def load_checked_hparams(hparams_file, overrides="", input_keys=None):
    """Loads ``hparams_file`` with ``overrides`` (yaml text or dict), after checking both.

    ``hparams_file`` may be a derived config (see ``resolve_derived_config``). ``input_keys(values)``
    lists the keys whose paths must exist: checked before any object of the config is built.

    Raises
    ------
    ConfigError
        For an override key the config lacks (naming the closest key), a value of the
        wrong type, a misspelled ``!include:`` parameter, an unset ``!PLACEHOLDER``, or an input
        path that does not exist.
    """
    derived_file = hparams_file
    hparams_file, overrides = resolve_derived_config(hparams_file, overrides)
    tree = read_yaml_tree(hparams_file)
    check_keys(overrides, tree, hparams_file if derived_file == hparams_file else
               f"{hparams_file} (the base of {derived_file})")
    check_include_parameters(tree, os.path.dirname(os.path.abspath(hparams_file)), "")
    try:
        if input_keys is not None:
            values = preview_config(hparams_file, overrides)
            check_input_paths(values, input_keys(values))
        with open_config(hparams_file) as f:
            return load_hyperpyyaml(f, overrides)
    except ValueError as error:
        missing = re.search(r"'(.+?)' is a !PLACEHOLDER", str(error))
        if missing is None:
            raise
        key = missing.group(1)
        raise ConfigError(
            f"{key} is a !PLACEHOLDER in {hparams_file}: give it a value, e.g. "
            f"--{key.split('[')[0]}=... on the command line (or in a derived config)"
        ) from error


def create_output_folder(hparams, hparams_file, overrides, argv):
    """Creates ``hparams["output_folder"]`` with the resolved config (hyperparams.yaml),
    the command line (command.txt) and log.txt; takes the run lock."""
    if "output_folder" not in hparams:
        raise ConfigError(f"{hparams_file} has no output_folder: add one (e.g. exp/<name>)")
    folder = hparams["output_folder"]
    sb.create_experiment_directory(folder, overrides=overrides)
    if sb.utils.distributed.if_main_process():
        acquire_process_lock(folder)
        save_resolved_config(hparams_file, overrides, os.path.join(folder, "hyperparams.yaml"))
        with open(os.path.join(folder, "command.txt"), "a", encoding="utf-8") as f:
            f.write(shlex.join(["python", sys.argv[0], *argv]) + "\n")


def save_resolved_config(hparams_file, overrides, path):
    """Writes the config with its overrides and references resolved to ``path`` (SpeechBrain's
    hyperparams.yaml, read by common.models.experiment to rebuild the model)."""
    with open_config(hparams_file) as f:
        resolved = resolve_references(f, overrides).getvalue()
    atomic_write_text(path, f"# Generated {datetime.date.today()} from:\n# {os.path.abspath(hparams_file)}\n"
                      f"# yamllint disable\n{resolved}")


def check_input_paths(hparams, keys):
    """Raises ConfigError for a path under one of ``keys`` (a path, a list of paths or null) that does
    not exist, naming the key, the path and how to make it."""
    for key in keys:
        value = hparams.get(key)
        for path in value if isinstance(value, (list, tuple)) else [value]:
            if path is not None and not os.path.exists(str(path)):
                raise ConfigError(
                    f"{key}: {path} does not exist: fix --{key}=... or make it first (shards and their "
                    "parquet: local/make_shards.py; tokenizer: local/train_tokenizer.py; units: "
                    "local/extract_units.py; or the recipe's run.sh stages)")


def end_distributed():
    """Destroy the DDP process group, if any, before the interpreter exits: left to the exit, gloo's
    threads can meet their destructors still running and abort the rank (``terminate called without an
    active exception``, SIGABRT) after its work is done."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def choose_distributed_backend(run_opts):
    """``run_opts`` with the gloo backend when torchrun runs on a machine without CUDA
    (SpeechBrain's default, nccl, needs GPUs); else unchanged."""
    launched = None not in (sb.utils.distributed.get_rank(), sb.utils.distributed.get_local_rank())
    if launched and run_opts["distributed_backend"] == "nccl" and not torch.cuda.is_available():
        logger.info("No CUDA device: the DDP group uses the gloo backend (CPU)")
        return dataclasses.replace(run_opts, distributed_backend="gloo",
                                   overridden_args={*run_opts.overridden_args, "distributed_backend"})
    return run_opts


def last_override_wins(argv):
    """``argv`` without the earlier of repeated ``--key=value`` overrides, so that a later one (e.g.
    after run.sh's ``--``) replaces an earlier one instead of failing as a duplicate yaml key."""
    keys = [arg.split("=", 1)[0] if arg.startswith("--") and "=" in arg else None for arg in argv]
    return [arg for i, (arg, key) in enumerate(zip(argv, keys)) if key is None or key not in keys[i + 1:]]


def prepare_experiment(argv, input_keys=None):
    """Parses ``train.py hparams.yaml --key=value ...`` (``argv`` without the script), loads
    and checks the config (and that the paths under ``input_keys(values)`` exist), joins the DDP
    group when launched by torchrun, creates the experiment folder. Returns ``(hparams, run_opts)``
    for ``sb.Brain``."""
    argv, force_resume = pop_force_flag(argv)
    config_file, run_opts, command_line = sb.parse_arguments(last_override_wins(argv))
    hparams = load_checked_hparams(config_file, command_line, input_keys)  # errors name the config given
    hparams_file, overrides = resolve_derived_config(config_file, command_line)
    run_opts = choose_distributed_backend(run_opts)
    sb.utils.distributed.ddp_init_group(run_opts)
    create_output_folder(hparams, hparams_file, overrides, argv)
    if input_keys is not None:
        keys = input_keys(hparams)
        lock_inputs(hparams, keys, argv[0], force_resume, lock_settings(preview_config(hparams_file, overrides), keys))
    return hparams, run_opts


def lock_settings(values, input_keys):
    """The lock's ``settings`` of previewed config ``values``: neither the inputs (hashed apart) nor
    the paths inside the experiment folder (they move with it)."""
    folder = str(values.get("output_folder", ""))
    settings = config_settings(values, skip={*input_keys, *EVALUATION_KEYS, "output_folder"})
    return {key: value for key, value in settings.items()
            if not (folder and isinstance(value, str) and value.startswith(folder))}


def lock_inputs(hparams, keys, config_file, force_resume=False, settings=None):
    """Write the experiment's ``lock.json`` (``common.fingerprint``); a resume on changed training inputs stops
    here, before any work (every rank raises, so no rank waits for the others)."""
    folder = hparams["output_folder"]
    save_folder = hparams.get("save_folder", os.path.join(folder, "save"))
    has_checkpoints = os.path.isdir(save_folder) and any(name.startswith("CKPT") for name in os.listdir(save_folder))
    workers = hparams.get("num_workers", 0)
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    lock = make_lock(hparams, keys, world_size, workers, config_file, settings, previous=read_lock(folder))
    check_and_write_lock(folder, lock, has_checkpoints, force_resume, write=sb.utils.distributed.if_main_process(),
                         training=bool(hparams.get("do_train", True)))
