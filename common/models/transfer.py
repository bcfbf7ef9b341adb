"""Load pretrained weights into a recipe's objects by name (SpeechBrain's ``Pretrainer``).

A pretraining checkpoint folder (``save/CKPT+...``) holds one file per recoverable: ``model.ckpt``
(the shared graph, names of ``common/models/encoder_decoder.py``), ``normalize.ckpt`` (feature
statistics), ``heads.ckpt`` (pretraining-only weights, not transferred), ... A finetune recipe loads
the ones it names::

    load_pretrained("exp/pretrain_demo", {"model": model, "normalize": normalize},
                    collect_in="exp/finetune_demo/save/pretrained")
"""

import filecmp
import glob
import logging
import os

from speechbrain.utils.parameter_transfer import Pretrainer

from common.user_errors import UserValueError

logger = logging.getLogger(__name__)

CHECKPOINT_GLOB = "CKPT+*"
TOKENIZER_COPY = "tokenizer.model"  # the pretraining recipe copies its tokenizer into its folder


def resolve_checkpoint(source):
    """The checkpoint folder of ``source``: a ``CKPT+...`` folder itself, or the newest one under a
    save folder or an experiment folder (its ``save/``)."""
    if os.path.basename(os.path.normpath(source)).startswith("CKPT+"):
        return source
    for folder in (source, os.path.join(source, "save")):
        found = sorted(glob.glob(os.path.join(folder, CHECKPOINT_GLOB)), key=os.path.getmtime)
        if found:
            return found[-1]
    raise FileNotFoundError(f"no {CHECKPOINT_GLOB} checkpoint in {source} or {source}/save: pass a "
                            "pretraining experiment folder, its save/ folder or one checkpoint folder")


def load_pretrained(source, loadables, collect_in):
    """Load ``{name: object}`` from ``name.ckpt`` of the checkpoint of ``source``, by parameter name.

    Arguments
    ---------
    source : str
        Pretraining experiment folder, its save folder, or a ``CKPT+`` folder.
    loadables : dict
        Objects to fill, named as in the pretraining checkpointer (``model``, ``normalize``).
    collect_in : str
        Folder where the files are linked before loading (kept as a record of what was loaded).

    Returns
    -------
    str
        The checkpoint folder used.
    """
    checkpoint = resolve_checkpoint(source)
    paths = {name: os.path.join(checkpoint, f"{name}.ckpt") for name in loadables}
    missing = [path for path in paths.values() if not os.path.isfile(path)]
    if missing:
        raise FileNotFoundError(f"{checkpoint} lacks {missing}: it holds "
                                f"{sorted(os.listdir(checkpoint))}; load only names it saved")
    pretrainer = Pretrainer(collect_in=collect_in, loadables=loadables, paths=paths)
    pretrainer.collect_files()
    pretrainer.load_collected()
    logger.info("loaded %s from %s", sorted(loadables), checkpoint)
    return checkpoint


def check_same_tokenizer(source, tokenizer_file):
    """Raise when ``source`` (a pretraining experiment folder) was trained with another tokenizer:
    token ids would mean other pieces, and the embedding and output sizes may differ."""
    copy = os.path.join(source, TOKENIZER_COPY)
    if os.path.isfile(copy) and not filecmp.cmp(copy, tokenizer_file, shallow=False):
        raise UserValueError(f"{tokenizer_file} is not the tokenizer {source} was pretrained with: "
                             f"finetune with --tokenizer_file={copy}")
