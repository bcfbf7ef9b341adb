#!/usr/bin/env python3
"""Text corpora for pretraining and language models -> text shards the text loader streams
(``common.data.make_text_loader``).

    python local/make_text_shards.py news.en.txt text/mono_en.parquet --lang en
    python local/make_text_shards.py pairs.tsv text/en_fr.parquet --paired --lang en --tgt-lang fr
    python local/make_text_shards.py corpus/train.jsonl text/pairs.parquet --paired \\
        --src-field translation --tgt-field text --lang xx --tgt-lang en

Inputs: a ``.txt`` file (one sentence a line; with ``--paired``, ``source<TAB>target``), a ``.tsv``
(``source<TAB>target``) or a ``.jsonl`` manifest (``--src-field`` / ``--tgt-field``; a line's own
``lang`` / ``tgt_lang`` fields override the options). The input is read as a stream: any size.

Output (``common/shard_format.py``): ``OUT.parquet`` is the corpus's metadata, one row per sentence
(pair) with ``sample_key``, ``shard_name`` and ``chars``; the sentences lie beside it in shards
``OUT-000000.parquet``, ... of ``--shard-sentences`` each, with ``sample_key``, ``text`` (source),
``translation`` (target, null for mono text), ``lang``, ``tgt_lang`` (language names; the loader turns
them into ``<lang>`` tags, which the tokenizer must hold as user symbols). Whitespace is collapsed.

Bad lines never stop a run: undecodable UTF-8, empty text, a missing or empty target, extra fields,
malformed JSON, text over ``--max-chars`` and exact duplicates go to ``OUT.rejects.jsonl`` (line number,
reason, detail), counted in the log. (Duplicates are found by an 8-byte hash per kept line: ~80 bytes
of memory per sentence, 8 GB per 10^8; ``--keep-duplicates`` skips the check.)

Resumable: every file is written under a temporary name and renamed when complete, metadata and rejects
last. Rerunning the same command after kill -9 keeps the complete shards a run with the same input and
options wrote (their schema carries that fingerprint), writes the rest and removes the temporaries.
Exit status: 0 on success, 1 when no line could be used, 2 on a usage error.
"""

import argparse
import collections
import glob
import hashlib
import json
import logging
import os
import re
import sys

import pyarrow.parquet as pq

from common.atomic import atomic_path, remove_temporaries
from common.shard_format import (
    TEXT_METADATA_SCHEMA,
    TEXT_SHARD_SCHEMA,
    shard_fingerprint,
    text_metadata_table,
    text_shard_name,
    write_text_shard,
)
from common.user_errors import run_command

logger = logging.getLogger("make_text_shards")

LANG_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")  # becomes the tokenizer symbol <lang>


class RejectedLine(Exception):
    """A line that cannot be used; ``reason`` is a short tag counted in the summary."""

    def __init__(self, reason, detail):
        super().__init__(detail)
        self.reason = reason


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Mono or paired text -> a parquet for the pretraining text loader.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("input", help=".txt (one sentence a line, or source<TAB>target with "
                        "--paired), .tsv (source<TAB>target) or .jsonl")
    parser.add_argument("output", help="metadata parquet to write, e.g. text/mono_en.parquet; the shards go "
                        "beside it (its folder is created)")
    parser.add_argument("--paired", action="store_true", help="source and target per line")
    parser.add_argument("--lang", help="source language name (tag <lang>), e.g. en")
    parser.add_argument("--tgt-lang", help="target language name for --paired, e.g. fr")
    parser.add_argument("--src-field", default="text", help="jsonl field of the source text")
    parser.add_argument("--tgt-field", default="translation", help="jsonl field of the target text")
    parser.add_argument("--max-chars", type=int, default=1000, help="longer sides are rejected")
    parser.add_argument("--prefix", help="sample key prefix (default: the output's file name)")
    parser.add_argument("--shard-sentences", type=int, default=100_000,
                        help="sentences (pairs) per shard: a shard is read whole by one loader worker, "
                        "and a corpus needs at least as many shards as training ranks")
    parser.add_argument("--keep-duplicates", action="store_true",
                        help="skip the duplicate check (its memory grows with the corpus)")
    return parser.parse_args(argv)


def clean(text):
    """Collapse runs of whitespace into single spaces and strip the ends."""
    return " ".join(text.split())


def fields_of_line(line, args, is_jsonl):
    """(source, target or None, lang, tgt_lang) of one decoded line; raises RejectedLine."""
    lang, tgt_lang = args.lang, args.tgt_lang if args.paired else None
    if is_jsonl:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise RejectedLine("malformed_json", str(error)) from error
        if not isinstance(record, dict):
            raise RejectedLine("malformed_json", "the line is not a JSON object")
        source, target = record.get(args.src_field), record.get(args.tgt_field) if args.paired else None
        lang, tgt_lang = record.get("lang", lang), record.get("tgt_lang", tgt_lang) if args.paired else None
    elif args.paired:
        parts = line.rstrip("\r\n").split("\t")
        if len(parts) != 2:
            raise RejectedLine("missing_target" if len(parts) < 2 else "extra_fields",
                               f"{len(parts)} tab-separated fields, expected source<TAB>target")
        source, target = parts
    else:
        source, target = line, None
    return source, target, lang, tgt_lang


def row_of_line(line, args, is_jsonl):
    """The parquet fields of one line (no key yet); raises RejectedLine with the reason."""
    source, target, lang, tgt_lang = fields_of_line(line, args, is_jsonl)
    source = clean(source) if isinstance(source, str) else ""
    if not source:
        raise RejectedLine("empty_text", f"no {args.src_field if is_jsonl else 'source'} text")
    if args.paired:
        target = clean(target) if isinstance(target, str) else ""
        if not target:
            raise RejectedLine("missing_target", "the target text is empty or missing")
    longest = max(len(source), len(target or ""))
    if longest > args.max_chars:
        raise RejectedLine("too_long", f"{longest} characters > --max-chars {args.max_chars}")
    for name in (lang, tgt_lang):
        if name is not None and not LANG_PATTERN.match(str(name)):
            raise RejectedLine("bad_lang", f"language {name!r} is not letters, digits, '_' or '-'")
    return {"text": source, "translation": target, "lang": lang, "tgt_lang": tgt_lang}


def kept_rows(args, rejects):
    """Yield the rows of the input's usable lines in order; write each bad line to ``rejects`` (a text
    file) as one JSON object: line number, reason, detail."""
    is_jsonl = args.input.endswith(".jsonl")
    prefix = args.prefix or os.path.splitext(os.path.basename(args.output))[0]
    seen = None if args.keep_duplicates else set()
    with open(args.input, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                row = row_of_line(decode_line(raw), args, is_jsonl)
                if seen is not None:
                    check_new(row, seen)
            except RejectedLine as error:
                rejects.write(json.dumps({"line": number, "reason": error.reason, "detail": str(error)},
                                         ensure_ascii=False) + "\n")
                continue
            yield {"sample_key": f"{prefix}-{number:09d}", **row}


def check_new(row, seen):
    """Raise RejectedLine(duplicate) when the same text (pair) was kept before; else remember it."""
    identity = hashlib.blake2b(f"{row['text']}\t{row['translation']}".encode(), digest_size=8).digest()
    if identity in seen:
        raise RejectedLine("duplicate", "the same text (pair) appeared on an earlier line")
    seen.add(identity)


def chunks(rows, size):
    """Consecutive lists of ``size`` rows (the last may be shorter)."""
    chunk = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def decode_line(raw):
    """UTF-8 text of a raw line; raises RejectedLine(not_utf8)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RejectedLine("not_utf8", f"byte {error.start}: {error.reason}") from error


def check_args(args):
    """Usage errors, with the fix."""
    if not os.path.isfile(args.input):
        raise ValueError(f"{args.input} does not exist: give a .txt, .tsv or .jsonl file")
    if args.input.endswith(".tsv") and not args.paired:
        raise ValueError(f"{args.input} is a .tsv (source<TAB>target): add --paired")
    if args.tgt_lang and not args.paired:
        raise ValueError("--tgt-lang is for --paired text: drop it or add --paired")
    if args.shard_sentences < 1:
        raise ValueError(f"--shard-sentences {args.shard_sentences}: give a positive number of sentences")


def fingerprint(args):
    """What a shard's content depends on: the input file (size, modification time) and the options."""
    stat = os.stat(args.input)
    options = {k: v for k, v in sorted(vars(args).items()) if k != "output"}
    return json.dumps({"input_bytes": stat.st_size, "input_mtime_ns": stat.st_mtime_ns, **options}).encode()


def write_shard(path, rows, print_):
    """Write one shard atomically, unless a complete one with the same fingerprint is there (a rerun);
    returns its columns and whether it was written."""
    columns = {name: [row[name] for row in rows] for name in TEXT_SHARD_SCHEMA.names}
    if shard_fingerprint(path) == print_:
        return columns, False
    write_text_shard(path, columns, print_)
    return columns, True


def write_corpus(args):
    """Stream the input into shards, then the metadata and rejects (atomically, last);
    returns (sentences, shards written, shards kept from an earlier run, reject counts by reason)."""
    folder = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(folder, exist_ok=True)
    rejects_path = os.path.splitext(args.output)[0] + ".rejects.jsonl"
    for path in [args.output, rejects_path]:
        remove_temporaries(path)
    for leftover in shard_files(args.output, suffix=".tmp[0-9]*"):
        logger.info("removing %s, left by an interrupted run", leftover)
        os.remove(leftover)
    print_, sentences, written, shards = fingerprint(args), 0, 0, 0
    with atomic_path(args.output) as metadata_temporary, atomic_path(rejects_path) as rejects_temporary:
        with open(rejects_temporary, "w", encoding="utf-8") as rejects, \
                pq.ParquetWriter(metadata_temporary, TEXT_METADATA_SCHEMA) as metadata:
            for shards, rows in enumerate(chunks(kept_rows(args, rejects), args.shard_sentences), start=1):
                name = text_shard_name(args.output, shards - 1)
                columns, new = write_shard(os.path.join(folder, name), rows, print_)
                metadata.write_table(text_metadata_table(columns, name))
                written += new
                sentences += len(rows)
        if not sentences:
            raise NoUsableLine(sum(1 for _ in open(rejects_temporary, encoding="utf-8")))
    remove_stale_shards(args.output, shards)
    reasons = collections.Counter(json.loads(line)["reason"] for line in open(rejects_path, encoding="utf-8"))
    return sentences, written, shards - written, dict(reasons), rejects_path


class NoUsableLine(Exception):
    """Every line of the input was rejected (the count is the argument)."""


def shard_files(output, suffix=""):
    """The shard files of ``output`` on disk (any number; with ``suffix``, their temporaries), sorted."""
    pattern = os.path.join(glob.escape(os.path.dirname(os.path.abspath(output))),
                           text_shard_name(output, 0).replace("000000", "[0-9]" * 6)) + suffix
    return sorted(glob.glob(pattern))


def remove_stale_shards(output, count):
    """Delete shards numbered ``count`` and above, left by an earlier run over a larger input."""
    for path in shard_files(output):
        if int(path[-len("000000.parquet"):-len(".parquet")]) >= count:
            logger.info("removing %s, a shard of an earlier run over more text", path)
            os.remove(path)


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        check_args(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    try:
        sentences, written, kept, reasons, rejects_path = write_corpus(args)
    except NoUsableLine as error:
        print(f"error: no usable line in {args.input} ({error.args[0]} rejected)", file=sys.stderr)
        sys.exit(1)
    logger.info("%s -> %s: %d %s in %d shards (%d kept from an earlier run), %d rejected %s (%s)", args.input,
                args.output, sentences, "pairs" if args.paired else "sentences", written + kept, kept,
                sum(reasons.values()), reasons or "", rejects_path)


if __name__ == "__main__":
    run_command(main)
