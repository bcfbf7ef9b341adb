#!/usr/bin/env python3
"""Scale curves on one machine, from synthetic metadata and text (no audio): how the epoch planner's time
and memory grow with utterances, shards and ranks, and how the text loader's grow with sentences.

One point, in its own process (its peak RSS is its own), ends with one JSON line::

    python bench/scale.py --utterances 10000000 --ranks 1024 --json
    python bench/scale.py --text-sentences 1000000 --json [--loader memory]
    python bench/scale.py --text-file lm_text.txt --loader memory --json   # a real text
    python bench/scale.py --text-file lm_text.txt --compare 5 --json      # every loader, 5 rounds

- ``--utterances N --ranks R``: what each rank does at each epoch start: ``plan_epoch`` of N utterances
  (durations 1-30 s) over ``--shards`` uneven shards (default N / 100, at least R and 100, at most
  10^5) for R ranks x ``--workers``, with the conformer recipe's speech batching (1200 s, 256 items,
  buffer 4096). ``seconds``: planning; ``peak_rss_mb``: the process's peak (imports and metadata
  arrays included; ``baseline_rss_mb`` is the RSS before planning).
- ``--text-sentences N``: N synthetic sentences (1-12 words) are written as text shards of
  ``--shard-sentences`` to a temporary folder with a tiny tokenizer (in a separate process), then one
  epoch of the text loader runs in another: ``--loader stream`` (``common.data.make_text_loader``, 2
  workers) or ``memory`` (the loader before text shards: every sentence read and tokenized in the main
  process). ``seconds``: loader construction + the epoch; ``peak_rss_mb``: the main process's peak;
  ``worker_peak_rss_mb``: the largest worker's (read every 10 batches); ``tokens_per_s``: source +
  target tokens per second. The first start over a corpus also tokenizes every shard once for its token
  counts (and keeps the ids beside the shard, which later starts and epochs read); ``--counted`` times a
  later start, after an untimed first epoch. ``--workers 0`` streams in the main process, as the
  in-memory loader reads. ``--compare ROUNDS`` runs every loader ROUNDS times over and prints the median
  tokens/s of each and its ratio to the in-memory loader's.
- ``--text-file PATH``: the same on a real text (one sentence a line, sharded by make_text_shards.py,
  a 500-piece unigram tokenizer trained on it).

The curves: ``python bench/scale.py --sweep OUT_DIR`` runs every point (each in its own process) up to
``--max-utterances`` / ``--max-sentences``, prints a table and writes ``scale_planning.png`` and
``scale_text.png``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SPEECH_BATCHING = {"budget": 1200.0, "max_batch_size": 256, "buffer_size": 4096}  # conformer.yaml speech_loader
TEXT_BATCHING = {"max_batch_tokens": 24000, "max_batch_size": 256}  # conformer.yaml text_loader


def rss_mb():
    """Resident memory of this process now (MB)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def peak_rss_mb():
    """Peak resident memory of this process (MB): the kernel's VmHWM, the high-water mark of the VmRSS
    ``rss_mb`` reads (getrusage's ru_maxrss is counted apart and can fall a little below it)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def children_peak_rss_mb():
    """The largest peak resident memory (MB) among this process's running children (dataloader workers)."""
    peaks = [0.0]
    for children in Path("/proc/self/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                status = Path(f"/proc/{pid}/status").read_text().splitlines()
            except OSError:  # it ended meanwhile
                continue
            peaks += [int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:")]
    return max(peaks)


def synthetic_speech_metadata(utterances, shards, seed=0):
    """(durations in s, shard of each row) of ``utterances`` over ``shards`` uneven shards, in tar order."""
    rng = np.random.default_rng(seed)
    durations = np.clip(rng.gamma(2.0, 4.0, utterances), 1.0, 30.0)
    sizes = rng.multinomial(utterances - shards, rng.dirichlet(np.full(shards, 4.0))) + 1  # >= 1 per shard
    return durations, np.repeat(np.arange(shards, dtype=np.int64), sizes)


def planning_point(args):
    """Plan one epoch for ``args.ranks`` ranks; seconds and memory."""
    from common.data.planning import plan_epoch

    shards = args.shards or int(np.clip(args.utterances // 100, max(100, args.ranks), 100_000))
    durations, shard_of_row = synthetic_speech_metadata(args.utterances, shards)
    baseline = rss_mb()
    start = time.perf_counter()
    plan = plan_epoch(durations, shard_of_row, seed=1, epoch=0, world_size=args.ranks, num_workers=args.workers,
                      **SPEECH_BATCHING)
    seconds = time.perf_counter() - start
    return {"utterances": args.utterances, "ranks": args.ranks, "shards": shards, "workers": args.workers,
            "batches_per_rank": sum(len(slot.batches) for slot in plan[0]), "seconds": round(seconds, 3),
            "baseline_rss_mb": round(baseline, 1), "peak_rss_mb": round(peak_rss_mb(), 1)}


def write_text_corpus(folder, sentences, shard_sentences, text_file=None):
    """Text shards and a tokenizer in ``folder`` (synthetic sentences, or ``text_file`` sharded)."""
    from common.data.synthetic import train_tiny_tokenizer, write_text_shards

    metadata = folder / "text.parquet"
    if text_file is None:
        sizes = [shard_sentences] * (sentences // shard_sentences) + ([sentences % shard_sentences] * bool(
            sentences % shard_sentences))
        write_text_shards(metadata, sizes)
        train_tiny_tokenizer(folder)
        return
    import sentencepiece

    from common.tokens import SENTENCEPIECE_IDS
    from local import make_text_shards

    make_text_shards.main([text_file, str(metadata), "--shard-sentences", str(shard_sentences)])
    sentencepiece.SentencePieceTrainer.train(
        input=text_file, model_prefix=str(folder / "unigram_30"), vocab_size=500, minloglevel=2,
        input_sentence_size=200_000, shuffle_input_sentence=True, **SENTENCEPIECE_IDS)


def in_memory_epoch(metadata, tokenizer, config):
    """The text loader before text shards: every sentence read and tokenized in the main process, one
    plan over a permutation of all rows, batches collated in the main process. Yields batches."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from common.data.batching import buffered_batches
    from common.data.text import TextColumns, TextShardDataset, encode_rows
    from common.shard_format import text_shard_paths

    table = pa.concat_tables([pq.read_table(path) for path in text_shard_paths(metadata)])
    keys, texts, src, tgt = encode_rows(table, tokenizer, TextColumns())
    del table
    lengths = np.array([len(s) + len(t) for s, t in zip(src, tgt)], dtype=np.float64)
    rng = np.random.default_rng([0, 0, 2])
    rows = rng.permutation(len(keys))
    batches = [rows[b] for b in buffered_batches(lengths[rows], budget=config.max_batch_tokens, rng=rng,
                                                 max_batch_size=config.max_batch_size,
                                                 buffer_size=config.batch_buffer)]
    collator = TextShardDataset(None, tokenizer, TextColumns(), seed=0, batching=None)
    for position, batch in enumerate(batches):
        yield collator.collate([(keys[r], texts[r], src[r], tgt[r]) for r in batch],
                               np.random.default_rng([0, 0, position, 4]))


def text_epoch_point(folder, loader, workers):
    """One epoch of the text loader over the corpus in ``folder``; seconds, memory, tokens per second."""
    from common.data import TextLoaderConfig, Tokenizer, make_text_loader

    tokenizer = Tokenizer(folder / "unigram_30.model")
    config = TextLoaderConfig(num_workers=workers if loader == "stream" else 0, **TEXT_BATCHING)
    baseline = rss_mb()
    start = time.perf_counter()
    if loader == "stream":
        batches = make_text_loader(folder / "text.parquet", tokenizer, config)
    else:
        batches = in_memory_epoch(folder / "text.parquet", tokenizer, config)
    sentences = tokens = 0
    worker_peak = 0.0
    for position, batch in enumerate(batches):
        if position % 10 == 0:  # workers end with the epoch: their high-water marks are read while they run
            worker_peak = max(worker_peak, children_peak_rss_mb())
        sentences += len(batch.id)
        tokens += int(batch.src_tokens.lengths.mul(batch.src_tokens.data.shape[1]).round().sum()
                      + batch.tokens.lengths.mul(batch.tokens.data.shape[1]).round().sum())
    seconds = time.perf_counter() - start
    return {"loader": loader, "workers": workers if loader == "stream" else 0, "sentences": sentences,
            "tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds),
            "baseline_rss_mb": round(baseline, 1), "peak_rss_mb": round(peak_rss_mb(), 1),
            "worker_peak_rss_mb": round(worker_peak, 1)}


def text_point(args):
    """Write the corpus in one process, run the epoch in another (each peak RSS its own)."""
    with tempfile.TemporaryDirectory(prefix="scale_text_") as folder:
        write = [sys.executable, __file__, "--write-text", folder, "--text-sentences", str(args.text_sentences or 0),
                 "--shard-sentences", str(args.shard_sentences)] + (["--text-file", args.text_file] * bool(
                     args.text_file))
        subprocess.run(write, check=True, stdout=subprocess.DEVNULL, env=child_env())
        epoch = [sys.executable, __file__, "--epoch-of", folder, "--loader", args.loader, "--workers",
                 str(args.workers), "--json"]
        if args.counted and args.loader == "stream":  # a first start counts and caches every shard's tokens
            subprocess.run(epoch, check=True, capture_output=True, env=child_env())
        result = subprocess.run(epoch, check=True, capture_output=True, text=True, env=child_env())
        point = json.loads(result.stdout.strip().splitlines()[-1])
    return {"text_sentences": args.text_sentences, "text_file": args.text_file,
            "shard_sentences": args.shard_sentences, "counted": bool(args.counted), **point}


COMPARED = (("memory", 0, False), ("stream", 0, False), ("stream", 0, True), ("stream", None, False),
            ("stream", None, True))  # (loader, workers (None: --workers), counted) of --compare


def compare_text_loaders(args):
    """``--compare ROUNDS``: the text point of every loader in ``COMPARED``, one after the other, ROUNDS
    times over (a sub-second epoch moves by 20 % between runs); per loader the median tokens/s and its
    ratio to the in-memory loader's median, with each round's ratio."""
    runs = {leg: [] for leg in COMPARED}
    for _ in range(args.compare):
        for leg in COMPARED:
            loader, workers, counted = leg
            options = argparse.Namespace(**{**vars(args), "loader": loader, "counted": counted,
                                            "workers": args.workers if workers is None else workers})
            runs[leg].append(text_point(options)["tokens_per_s"])
    memory = runs[COMPARED[0]]
    legs = [{"loader": loader, "workers": args.workers if workers is None else workers, "counted": counted,
             "tokens_per_s": int(np.median(rates)), "ratio": round(float(np.median(rates) / np.median(memory)), 2),
             "round_ratios": [round(rate / base, 2) for rate, base in zip(rates, memory)]}
            for (loader, workers, counted), rates in runs.items()]
    print_table(legs, ["loader", "workers", "counted", "tokens_per_s", "ratio", "round_ratios"])
    return {"text_sentences": args.text_sentences, "text_file": args.text_file,
            "shard_sentences": args.shard_sentences, "rounds": args.compare, "legs": legs}


def child_env():
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")


def run_point(options):
    """Run ``bench/scale.py OPTIONS --json`` in its own process; its JSON line as a dict."""
    result = subprocess.run([sys.executable, __file__, *map(str, options), "--json"], capture_output=True,
                            text=True, env=child_env())
    if result.returncode != 0:
        raise RuntimeError(f"bench/scale.py {' '.join(map(str, options))} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def sweep(args):
    """Every planning and text point up to the given sizes; a table on stdout and two PNGs."""
    out = Path(args.sweep)
    out.mkdir(parents=True, exist_ok=True)
    planning = [run_point(["--utterances", n, "--ranks", r, "--workers", args.workers])
                for r in (1, 64, 1024) for n in powers_of_ten(10_000, args.max_utterances)]
    text = [run_point(["--text-sentences", n, "--loader", loader, "--shard-sentences", args.shard_sentences])
            for loader in ("stream", "memory") for n in powers_of_ten(100_000, args.max_sentences)]
    (out / "scale.json").write_text(json.dumps({"planning": planning, "text": text}, indent=1))
    print_table(planning, ["utterances", "ranks", "shards", "batches_per_rank", "seconds", "peak_rss_mb"])
    print_table(text, ["loader", "sentences", "seconds", "tokens_per_s", "peak_rss_mb", "worker_peak_rss_mb"])
    plot(planning, text, out)


def powers_of_ten(low, high):
    sizes = []
    while low <= high:
        sizes.append(int(low))
        low *= 10
    return sizes


def print_table(rows, columns):
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")


def plot(planning, text, out):
    """``scale_planning.png`` (seconds and peak MB against utterances, a line per rank count) and
    ``scale_text.png`` (peak MB and tokens/s against sentences, a line per loader)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, rows, x, group, panels in (
            ("scale_planning.png", planning, "utterances", "ranks", ("seconds", "peak_rss_mb")),
            ("scale_text.png", text, "sentences", "loader", ("peak_rss_mb", "tokens_per_s"))):
        figure, axes = plt.subplots(1, 2, figsize=(10, 4))
        for axis, y in zip(axes, panels):
            for value in dict.fromkeys(row[group] for row in rows):
                points = [(row[x], row[y]) for row in rows if row[group] == value]
                axis.plot(*zip(*points), marker="o", label=f"{group} {value}")
            axis.set(xscale="log", yscale="log", xlabel=x, ylabel=y)
            axis.grid(True, which="both", alpha=0.3)
            axis.legend()
        figure.tight_layout()
        figure.savefig(out / name, dpi=100)
        plt.close(figure)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--utterances", type=int, help="plan an epoch of this many utterances")
    parser.add_argument("--ranks", type=int, default=1, help="ranks the planned epoch is divided between")
    parser.add_argument("--shards", type=int, help="shards (default: utterances / 100 in [max(100, ranks), 10^5])")
    parser.add_argument("--workers", type=int, default=2, help="dataloader workers per rank")
    parser.add_argument("--text-sentences", type=int, help="one epoch of the text loader over this many sentences")
    parser.add_argument("--text-file", help="a real text (one sentence a line) instead of synthetic sentences")
    parser.add_argument("--shard-sentences", type=int, default=100_000, help="sentences per text shard")
    parser.add_argument("--loader", choices=("stream", "memory"), default="stream",
                        help="text shards streamed by workers, or the earlier in-memory loader")
    parser.add_argument("--counted", action="store_true", help="time an epoch whose token counts an untimed first "
                        "epoch cached (every start after a corpus's first), not the first")
    parser.add_argument("--compare", type=int, metavar="ROUNDS", help="every text loader (memory; stream with 0 "
                        "and --workers workers, first and later start) ROUNDS times over; medians and ratios")
    parser.add_argument("--sweep", metavar="OUT_DIR", help="run every point; table, scale.json and PNGs")
    parser.add_argument("--max-utterances", type=int, default=10_000_000)
    parser.add_argument("--max-sentences", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true", help="end with the point as one JSON line")
    parser.add_argument("--write-text", metavar="DIR", help=argparse.SUPPRESS)  # the corpus of a text point
    parser.add_argument("--epoch-of", metavar="DIR", help=argparse.SUPPRESS)  # the epoch of a text point
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.write_text:
        return write_text_corpus(Path(args.write_text), args.text_sentences, args.shard_sentences, args.text_file)
    if args.sweep:
        return sweep(args)
    if args.epoch_of:
        point = text_epoch_point(Path(args.epoch_of), args.loader, args.workers)
    elif args.compare and (args.text_sentences or args.text_file):
        point = compare_text_loaders(args)
    elif args.text_sentences or args.text_file:
        point = text_point(args)
    elif args.utterances:
        point = planning_point(args)
    else:
        sys.exit("error: give --utterances N [--ranks R], --text-sentences N, --text-file PATH or --sweep OUT_DIR")
    print(json.dumps(point) if args.json else "\n".join(f"{k}: {v}" for k, v in point.items()))


if __name__ == "__main__":
    main()
