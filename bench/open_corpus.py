"""The open corpus as the learning benches use it: shards of every split, the LM text without the training
transcripts, the character tokenizer, seeded labelled subsets and their unlabelled pools; each made once.

    from bench.open_corpus import prepare, labelled_subset
    data = prepare(args)   # args.corpus, args.data
    labelled, pool = labelled_subset(data.shards["train"], 0.15, 1234)
"""

import json
import logging
import os
import sys
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq

from bench.steps import run
from common.atomic import atomic_write_text
from common.shard_format import POOL_PARQUET, write_metadata

logger = logging.getLogger("open_corpus")
DEFAULT_CORPUS = os.path.join("data", "open", "corpus")
NEW_VOICES = "unlabelled_new_voices"
TEST_SPLITS = ("test_seen", "test_unseen", "test")


@dataclass
class Data:
    """The prepared corpus: shard folders by split, text parquets, the tokenizer."""

    shards: dict
    tests: list
    lm_text: str
    lm_valid: str
    tokenizer: str
    new_voices: str = None


def prepare(args):
    """Shards of every split (and of the new voices, untranscribed), the text parquets and the character
    tokenizer (with ``<mask>``) that every arm shares; each made once."""
    from local import make_shards, make_text_shards, train_tokenizer

    corpus = ensure_corpus(args.corpus)
    tests = [name for name in TEST_SPLITS if os.path.isfile(os.path.join(corpus, f"{name}.jsonl"))]
    splits = {"train": "train", "valid": "dev", **{name: name for name in tests}}
    if os.path.isfile(os.path.join(corpus, f"{NEW_VOICES}.jsonl")):
        splits[NEW_VOICES] = NEW_VOICES
    shards = {}
    for name, source in splits.items():
        shards[name] = os.path.join(args.data, "shards", name)
        if not os.path.isfile(os.path.join(shards[name], POOL_PARQUET)):
            make_shards.main([os.path.join(corpus, f"{source}.jsonl"), shards[name], "--prefix", name,
                              "--shard-size", "64", "--rebuild", *(["--unlabelled"] if name == NEW_VOICES else [])])
    texts = {}
    lm_text = text_without_train(corpus, os.path.join(args.data, "text", "lm_text_without_train.txt"))
    for name, source in (("lm_text", lm_text), ("lm_valid", os.path.join(corpus, "dev.jsonl"))):
        texts[name] = os.path.join(args.data, "text", f"{name}.parquet")
        if not os.path.isfile(texts[name]):
            make_text_shards.main([source, texts[name]])
    tokenizer = os.path.join(args.data, "tokenizer_pretrain", "char.model")
    if not os.path.isfile(tokenizer):
        train_tokenizer.main([shards["train"], texts["lm_text"], os.path.dirname(tokenizer), "--model-type", "char",
                              "--user-symbols", "<mask>"])
    if NEW_VOICES not in shards:
        logger.warning("%s has no %s.jsonl: the new-voice arms are skipped (make the corpus again with "
                       "local/synth_corpus.py --profile open to get it)", corpus, NEW_VOICES)
    return Data(shards, tests, texts["lm_text"], texts["lm_valid"], tokenizer, shards.get(NEW_VOICES))


def text_without_train(corpus, out):
    """``lm_text.txt`` less every training transcript, written once to ``out``: the pool's transcripts
    would otherwise reach the LM and text pretraining, and an LM that has read the very sentences it
    helps pseudo-label flatters self-training. (The labelled subset's are dropped too: it changes with
    the seed, the LM does not; they are under 3 % of the text.)"""
    if not os.path.isfile(out):
        with open(os.path.join(corpus, "train.jsonl"), encoding="utf-8") as lines:
            train = {json.loads(line)["text"].strip() for line in lines if line.strip()}
        with open(os.path.join(corpus, "lm_text.txt"), encoding="utf-8") as lines:
            sentences = [line.strip() for line in lines if line.strip()]
        kept = [sentence for sentence in sentences if sentence not in train]
        os.makedirs(os.path.dirname(out), exist_ok=True)
        atomic_write_text(out, "".join(f"{sentence}\n" for sentence in kept))
        logger.info("LM text: %d of %d sentences of lm_text.txt, without the %d training transcripts",
                    len(kept), len(sentences), len(sentences) - len(kept))
    return out


def ensure_corpus(corpus):
    """The corpus folder; the default open corpus is synthesized when missing, another must exist."""
    missing = [name for name in ("train.jsonl", "dev.jsonl", "lm_text.txt")
               if not os.path.isfile(os.path.join(corpus, name))]
    if missing and corpus == os.path.abspath(DEFAULT_CORPUS) and not os.path.exists(corpus):
        run([sys.executable, "local/synth_corpus.py", corpus, "--profile", "open"])
    elif missing:
        raise SystemExit(f"error: {corpus} lacks {missing}: give --corpus a folder made by local/synth_corpus.py "
                         "(or one with train.jsonl, dev.jsonl, test*.jsonl and lm_text.txt)")
    return corpus


def labelled_subset(train_shards, share, seed):
    """``(labelled parquet, pool parquet)`` beside the train shards: a seeded ``share`` of the rows, and
    the rest with its transcripts removed (the unlabelled pool)."""
    names = [os.path.join(train_shards, f"metadata_{kind}_{round(100 * share)}_seed{seed}.parquet")
             for kind in ("labelled", "pool")]
    if all(os.path.isfile(name) for name in names):
        return names
    table = pq.read_table(os.path.join(train_shards, POOL_PARQUET))
    chosen = np.zeros(table.num_rows, dtype=bool)
    chosen[np.random.default_rng(seed).choice(table.num_rows, size=max(1, round(share * table.num_rows)),
                                              replace=False)] = True
    rows = table.to_pylist()
    write_metadata([r for r, keep in zip(rows, chosen) if keep], names[0])
    write_metadata([{**r, "text": None} for r, keep in zip(rows, chosen) if not keep], names[1], unlabelled=True)
    labelled_s = sum(r["duration"] for r, keep in zip(rows, chosen) if keep)
    pool_s = sum(r["duration"] for r, keep in zip(rows, chosen) if not keep)
    logger.info("seed %d: %d labelled utterances (%.2f h), pool %.2f h (%.1fx)", seed, chosen.sum(),
                labelled_s / 3600, pool_s / 3600, pool_s / max(labelled_s, 1e-9))
    if pool_s < 5 * labelled_s:
        logger.warning("the unlabelled pool is only %.1fx the labelled audio (the bench's claim needs >= 5x): "
                       "lower --labelled-share", pool_s / max(labelled_s, 1e-9))
    return names
