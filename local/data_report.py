#!/usr/bin/env python3
"""A data report of shard folders before any training: what an epoch of them will look like.

    python local/data_report.py data/open/shards/train --tokenizer data/open/tokenizer/char.model \\
        --out reports/open_train [--budget 30] [--frames-per-second 25] [--max-duration 20]

Writes OUT/report.md (utterances and hours used and filtered out, duration and tokens-per-second
quantiles, the CTC alignment check against the encoder's frame rate, batches per epoch, padding, the
largest batch) with durations.png and tokens_per_second.png. The batches are the data loader's own
plan for the budget. For a recipe config, ``recipes/finetune/train.py CONFIG ... --dry_run=True``
writes the same report with the config's loader, model and filters and stops before training.
"""

import argparse
import logging
import os

from common.data import SpeechLoaderConfig, Tokenizer, make_speech_loader
from common.data.report import speech_loader_report, write_report
from common.shard_format import POOL_PARQUET
from common.user_errors import run_command


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("shards", nargs="+", help="shard folders (local/make_shards.py) or their parquets")
    parser.add_argument("--tokenizer", required=True, help="the SentencePiece model the recipe will use")
    parser.add_argument("--out", required=True, help="folder for report.md and the PNGs")
    parser.add_argument("--budget", type=float, default=30.0, help="padded seconds per batch (max_batch_seconds)")
    parser.add_argument("--max-batch-size", type=int, default=None, help="utterances per batch at most")
    parser.add_argument("--frames-per-second", type=float, default=25.0,
                        help="the encoder's frame rate (25 = 40 ms frames, small.yaml and conformer.yaml)")
    parser.add_argument("--max-duration", type=float, default=None, help="the loader's max_duration filter (s)")
    parser.add_argument("--max-tokens-per-second", type=float, default=None, help="the loader's filter of it")
    return parser.parse_args(argv)


def pool_parquet(path):
    """A shard folder's metadata parquet (a parquet path stays as it is)."""
    return path if path.endswith(".parquet") else os.path.join(path, POOL_PARQUET)


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    filters = {key: value for key, value in (("max_duration", args.max_duration),
                                            ("max_tokens_per_second", args.max_tokens_per_second)) if value}
    config = SpeechLoaderConfig(max_batch_seconds=args.budget, max_batch_size=args.max_batch_size,
                                filters=filters or None)
    tokenizer = Tokenizer(args.tokenizer)
    loader = make_speech_loader([pool_parquet(path) for path in args.shards], tokenizer, config)
    report = speech_loader_report(loader, tokenizer, args.frames_per_second)
    path = write_report(report, args.out, title=f"Data report: {' '.join(args.shards)}")
    print(open(path, encoding="utf-8").read())
    return 0


if __name__ == "__main__":
    run_command(main)
