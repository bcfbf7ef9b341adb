"""An experiment folder's resolved config (``hyperparams.yaml``), read back to rebuild its model.

Every recipe saves its config with overrides and references resolved (``common.recipe``); the model
graph (its ``graph`` block, or the language model's ``lm_model``) is rebuilt from it alone, with no data,
loggers or checkpointer::

    tree = read_config_tree("exp/finetune_small")
    graph = load_hyperpyyaml(graph_yaml(tree, num_tokens=60))   # graph["model"], graph["normalize"]

Used by decoding (``common.inference``) and by feature extraction from a trained encoder
(``common.models.encoder_features``).
"""

import io
import os
import re

from ruamel.yaml import YAML

CONFIG_FILE = "hyperparams.yaml"
AVERAGED_FILE = "averaged.ckpt"  # a finetuning's averaged weights, written by its test stage
VOCAB_SIZE_CALL = re.compile(r"!apply:common\.data\.vocab_size\s*\[[^\]]*\]")
VOCAB_SIZE_ANCHOR = re.compile(r"&(\w+)\s+!apply:common\.data\.vocab_size")


def read_config_tree(exp_dir):
    """The experiment's resolved config as a ruamel tree (tags kept, nothing instantiated)."""
    path = os.path.join(exp_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: give the output_folder of a finetune run "
                                "(recipes/finetune/train.py writes hyperparams.yaml there)")
    with open(path, encoding="utf-8") as f:
        return YAML().load(f)


def graph_yaml(tree, num_tokens, drop=(), block="graph"):
    """The config's model graph (its ``graph`` block, or another ``block``) as standalone YAML text,
    with the vocabulary size written as a number and the keys in ``drop`` left out."""
    graph = tree[block]
    for key in drop:
        graph.pop(key, None)
    buffer = io.StringIO()
    YAML().dump(graph if block == "graph" else {block: graph}, buffer)
    text = buffer.getvalue()
    for anchor in VOCAB_SIZE_ANCHOR.findall(text):  # a number has no aliases: HyperPyYAML renames them
        text = re.sub(rf"&{anchor}\b\s*", "", text).replace(f"*{anchor}", str(num_tokens))
    return VOCAB_SIZE_CALL.sub(str(num_tokens), text)
