#!/usr/bin/env python3
"""Train a SentencePiece tokenizer on every text the model will see.

    python local/train_tokenizer.py SHARD_DIR OUT_DIR --vocab-size N [--model-type unigram|bpe]
    python local/train_tokenizer.py SHARD_DIR OUT_DIR --model-type char
    python local/train_tokenizer.py shards/train text/mono.parquet:0.5 text/pairs.parquet OUT_DIR --vocab-size N

Sources: shard folders (their parquet's transcripts; untranscribed folders give none) and text
parquets of local/make_text_shards.py (mono text, and both sides of paired text). ``SOURCE:WEIGHT``
scales a source's share of the training text (2: its texts twice; 0.5: a seeded half). The language
names of text parquets (``lang``, ``tgt_lang``) become ``<lang>`` user symbols, after --user-symbols.

Writes OUT_DIR/{model_type}_{vocab_size}.model and .vocab (OUT_DIR/char.model for characters: every
character of the text is a piece, so the size follows from the text; a --vocab-size given is
checked). Ids are fixed so the recipes can rely on them (common/tokens.py): 0 = <blank> (padding
and the CTC blank), 1 = <s>, 2 = </s>, 3 = <unk>, then the --user-symbols (language tags, <mask>,
...), then the learned pieces. Training is deterministic: the same texts and
options give the same model (one thread, no sampling of the input), so a rerun whose texts and options
are unchanged keeps the model (``{name}.inputs.sha256`` records them) and any change retrains it.
"""

import argparse
import hashlib
import json
import logging
import os
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import sentencepiece as spm

from common.atomic import atomic_path, atomic_write_text
from common.shard_format import (
    CORE_PARQUET,
    POOL_PARQUET,
    is_text_metadata,
    is_unlabelled,
    read_metadata,
    text_shard_paths,
)
from common.tokens import SENTENCEPIECE_IDS
from common.user_errors import run_command

logger = logging.getLogger("train_tokenizer")
SPECIAL_PIECES = SENTENCEPIECE_IDS


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Train a SentencePiece tokenizer on shard texts.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("sources", nargs="+", metavar="SOURCE[:WEIGHT]",
                        help="shard folder(s) and text parquet(s) whose texts are used")
    parser.add_argument("out_dir", help="folder for the .model and .vocab files (created)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="pieces, special ones included (unigram and bpe need it; char: the text's)")
    parser.add_argument("--model-type", default="unigram", choices=("unigram", "bpe", "char"))
    parser.add_argument("--metadata", default="pool", choices=("pool", "core"),
                        help="which parquet's texts to train on")
    parser.add_argument("--text-field", default="text",
                        help="parquet column or key of the 'extra' json to read (e.g. translation)")
    parser.add_argument("--user-symbols", default="", help="comma-separated pieces kept whole, "
                        "e.g. '<en>,<de>,<mask>'")
    parser.add_argument("--character-coverage", type=float, default=1.0,
                        help="share of characters covered; lower (0.9995) for large alphabets")
    return parser.parse_args(argv)


def read_texts(shard_dirs, metadata="pool", text_field="text"):
    """All non-empty texts of ``text_field`` in the chosen parquet of each shard folder."""
    name = POOL_PARQUET if metadata == "pool" else CORE_PARQUET
    texts = []
    for shard_dir in shard_dirs:
        table = read_metadata(os.path.join(shard_dir, name))
        if text_field in table.column_names:
            texts += table.column(text_field).to_pylist()
        else:
            texts += [json.loads(extra).get(text_field) for extra in table.column("extra").to_pylist()]
    texts = [t.strip() for t in texts if isinstance(t, str) and t.strip()]
    if not texts:
        raise ValueError(f"no '{text_field}' text found in {name} of {', '.join(shard_dirs)}")
    return texts


def parse_source(spec):
    """``(path, weight)`` of ``PATH[:WEIGHT]``."""
    path, _, weight = spec.rpartition(":")
    try:
        return (path, float(weight)) if path else (spec, 1.0)
    except ValueError:
        return spec, 1.0


def read_text_parquet(path):
    """Texts of a make_text_shards.py corpus (its metadata parquet: source and, for pairs, target, read
    from its shards) and its ``<lang>`` tags."""
    table = pa.concat_tables([pq.read_table(shard) for shard in text_shard_paths(path)]) \
        if is_text_metadata(path) else pq.read_table(path)
    if "text" not in table.column_names:
        raise ValueError(f"{path} is not a text parquet of local/make_text_shards.py (no 'text' column)")
    texts, tags = [], set()
    for column in ("text", "translation"):
        if column in table.column_names:
            texts += [t.strip() for t in table.column(column).to_pylist() if isinstance(t, str) and t.strip()]
    for column in ("lang", "tgt_lang"):
        if column in table.column_names:
            tags |= {f"<{lang}>" for lang in table.column(column).to_pylist() if lang}
    return texts, tags


def weighted(texts, weight, seed=0):
    """``texts`` repeated ``int(weight)`` times plus a seeded share ``weight % 1`` of them."""
    if weight < 0:
        raise ValueError(f"a source weight must be >= 0, got {weight}")
    share = round((weight % 1) * len(texts))
    chosen = sorted(np.random.default_rng(seed).permutation(len(texts))[:share])
    return texts * int(weight) + [texts[i] for i in chosen]


def read_sources(specs, metadata="pool", text_field="text"):
    """``(texts, language tags)`` of every ``PATH[:WEIGHT]``: shard folders and text parquets."""
    texts, tags = [], set()
    for spec in specs:
        path, weight = parse_source(spec)
        if path.endswith(".parquet") and os.path.isfile(path):
            source_texts, source_tags = read_text_parquet(path)
            tags |= source_tags
        elif is_unlabelled(os.path.join(path, POOL_PARQUET)):
            logger.info("%s is untranscribed speech (--unlabelled): it adds no text", path)
            continue
        else:
            source_texts = read_texts([path], metadata, text_field)
        logger.info("%s: %d texts, weight %g", path, len(source_texts), weight)
        texts += weighted(source_texts, weight)
    if not texts:
        raise ValueError(f"no text found in {', '.join(specs)}: give transcribed shards or text parquets")
    return texts, sorted(tags)


def tokenizer_name(model_type, vocab_size):
    """The file stem of a tokenizer: ``unigram_500``, ``bpe_300``, ``char`` (its size is the text's)."""
    return "char" if model_type == "char" else f"{model_type}_{vocab_size}"


def char_vocab_size(texts, user_symbols=()):
    """Pieces of a character model of ``texts``: each character (space as ▁) plus the special ones."""
    return len(set("".join(texts).replace(" ", "▁"))) + len(SPECIAL_PIECES) + len(user_symbols)


def train_tokenizer(texts, out_dir, vocab_size=None, model_type="unigram", user_symbols=(),
                    character_coverage=1.0):
    """Train on ``texts``; returns the .model path. Raises ValueError when vocab_size cannot be met
    (``vocab_size`` None: a character model's own size; unigram and bpe need one)."""
    os.makedirs(out_dir, exist_ok=True)
    if vocab_size is None:
        if model_type != "char":
            raise ValueError(f"a {model_type} tokenizer needs --vocab-size (e.g. 500)")
        vocab_size = char_vocab_size(texts, user_symbols)
    _check_vocab_size(texts, vocab_size, model_type, user_symbols)
    prefix = os.path.join(out_dir, tokenizer_name(model_type, vocab_size))
    inputs = inputs_digest(texts, vocab_size, model_type, user_symbols, character_coverage)
    if is_up_to_date(prefix, inputs):
        logger.info("%s.model is up to date (same texts and options): kept", prefix)
        return prefix + ".model"
    with tempfile.TemporaryDirectory(dir=out_dir) as work:
        corpus = os.path.join(work, "texts.txt")
        with open(corpus, "w", encoding="utf-8") as handle:
            handle.writelines(t + "\n" for t in texts)
        try:
            spm.SentencePieceTrainer.train(
                input=corpus, model_prefix=os.path.join(work, "sp"), vocab_size=vocab_size,
                model_type=model_type, character_coverage=character_coverage,
                user_defined_symbols=list(user_symbols), pad_piece="<blank>", num_threads=1,
                hard_vocab_limit=model_type != "char", input_sentence_size=0,
                shuffle_input_sentence=False, minloglevel=2, **SPECIAL_PIECES)
        except RuntimeError as error:
            raise ValueError(f"SentencePiece could not train a {model_type} vocabulary of "
                             f"{vocab_size}: {error}. Lower --vocab-size.") from error
        for extension in ("model", "vocab"):
            with atomic_path(f"{prefix}.{extension}") as temporary:
                os.replace(os.path.join(work, f"sp.{extension}"), temporary)
    atomic_write_text(prefix + INPUTS_SUFFIX, inputs)  # last: its presence vouches for the model beside it
    return prefix + ".model"


INPUTS_SUFFIX = ".inputs.sha256"


def inputs_digest(texts, vocab_size, model_type, user_symbols, character_coverage):
    """sha256 of everything the model is trained from (texts in order, options)."""
    digest = hashlib.sha256(json.dumps([vocab_size, model_type, list(user_symbols), character_coverage]).encode())
    for text in texts:
        digest.update(text.encode("utf-8") + b"\n")
    return digest.hexdigest()


def is_up_to_date(prefix, inputs):
    """Whether ``prefix``.model exists and was trained from ``inputs`` (the recorded digest)."""
    recorded = prefix + INPUTS_SUFFIX
    return (os.path.isfile(prefix + ".model") and os.path.isfile(recorded)
            and open(recorded, encoding="utf-8").read().strip() == inputs)


def _check_vocab_size(texts, vocab_size, model_type, user_symbols):
    """Fail early, with the numbers, when the text cannot support ``vocab_size`` pieces."""
    specials = len(SPECIAL_PIECES) + len(user_symbols)
    characters = char_vocab_size(texts, user_symbols) - specials
    if model_type == "char" and vocab_size != characters + specials:
        raise ValueError(f"--vocab-size {vocab_size} does not fit a char model of this text: it has "
                         f"{characters} characters + {specials} special pieces = "
                         f"{characters + specials}; leave --vocab-size out for characters")
    if model_type != "char" and vocab_size <= characters + specials:
        raise ValueError(f"--vocab-size {vocab_size} is too small: the text has {characters} distinct "
                         f"characters and there are {specials} special pieces; use more than "
                         f"{characters + specials} or --model-type char")


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    symbols = [s for s in args.user_symbols.split(",") if s]
    try:
        texts, tags = read_sources(args.sources, args.metadata, args.text_field)
        symbols += [tag for tag in tags if tag not in symbols]
        model = train_tokenizer(texts, args.out_dir, args.vocab_size, args.model_type, symbols,
                                args.character_coverage)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    logger.info("trained %s on %d texts -> %s", args.model_type, len(texts), model)


if __name__ == "__main__":
    run_command(main)
