#!/usr/bin/env python3
"""Print one plain value of a recipe config (derived configs resolved), for run.sh.

    python local/config_value.py recipes/finetune/hparams/demo.yaml text_field      # -> text
    python local/config_value.py recipes/finetune/hparams/demo_st.yaml prefix_tokens # -> <pig>

Lists print comma-separated (the form local/train_tokenizer.py --user-symbols takes). Only plain
values are read (no !ref resolution): the keys run.sh needs before training are plain.
"""

import argparse
import sys

from common.recipe import ConfigError, read_yaml_tree, resolve_derived_config
from common.user_errors import run_command


def config_value(config, key):
    """The plain value of ``key`` in ``config`` after its base_config chain; lists joined by ','."""
    base, overrides = resolve_derived_config(config)
    tree = read_yaml_tree(base)
    if key not in tree:
        raise ConfigError(f"{config} has no key {key!r}")
    value = overrides.get(key, tree[key])
    if getattr(getattr(value, "tag", None), "value", None):
        raise ConfigError(f"{key} in {config} is not a plain value ({value.tag.value}): write it out")
    return ",".join(str(v) for v in value) if isinstance(value, list) else str(value)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="a recipe yaml (may be derived: base_config)")
    parser.add_argument("key", help="a top-level key with a plain value")
    args = parser.parse_args(argv)
    try:
        print(config_value(args.config, args.key))
    except (ConfigError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run_command(main)
