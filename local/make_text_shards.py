#!/usr/bin/env python3
"""Text corpora for pretraining -> a parquet the text loader reads (``common.data.make_text_loader``).

    python local/make_text_shards.py news.en.txt text/mono_en.parquet --lang en
    python local/make_text_shards.py pairs.tsv text/en_fr.parquet --paired --lang en --tgt-lang fr
    python local/make_text_shards.py corpus/train.jsonl text/pairs.parquet --paired \\
        --src-field translation --tgt-field text --lang xx --tgt-lang en

Inputs: a ``.txt`` file (one sentence a line; with ``--paired``, ``source<TAB>target``), a ``.tsv``
(``source<TAB>target``) or a ``.jsonl`` manifest (``--src-field`` / ``--tgt-field``; a line's own
``lang`` / ``tgt_lang`` fields override the options). Output: one row per sentence (pair) with
``sample_key``, ``text`` (source), ``translation`` (target, null for mono text), ``lang``, ``tgt_lang``
(language names; the loader turns them into ``<lang>`` tags, which the tokenizer must hold as user
symbols). Whitespace is collapsed.

Bad lines never stop a run: undecodable UTF-8, empty text, a missing or empty target, extra fields,
malformed JSON, text over ``--max-chars`` and exact duplicates go to ``OUT.rejects.jsonl`` (line number,
reason, detail), counted in the log. The parquet is written under a temporary name and renamed, so a
rerun (after kill -9 too) simply rewrites it, removing the temporary files a killed run left.
Exit status: 0 on success, 1 when no line could be used, 2 on a usage error.
"""

import argparse
import collections
import json
import logging
import os
import re
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from common.atomic import atomic_path, atomic_write_text, remove_temporaries
from common.user_errors import run_command

logger = logging.getLogger("make_text_shards")

TEXT_SCHEMA = pa.schema([
    ("sample_key", pa.string()),
    ("text", pa.string()),
    ("translation", pa.string()),
    ("lang", pa.string()),
    ("tgt_lang", pa.string()),
])
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
    parser.add_argument("output", help="parquet to write (its folder is created)")
    parser.add_argument("--paired", action="store_true", help="source and target per line")
    parser.add_argument("--lang", help="source language name (tag <lang>), e.g. en")
    parser.add_argument("--tgt-lang", help="target language name for --paired, e.g. fr")
    parser.add_argument("--src-field", default="text", help="jsonl field of the source text")
    parser.add_argument("--tgt-field", default="translation", help="jsonl field of the target text")
    parser.add_argument("--max-chars", type=int, default=1000, help="longer sides are rejected")
    parser.add_argument("--prefix", help="sample key prefix (default: the output's file name)")
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


def read_rows(args):
    """(rows, rejects) of the input: each line decoded, checked, de-duplicated."""
    is_jsonl = args.input.endswith(".jsonl")
    prefix = args.prefix or os.path.splitext(os.path.basename(args.output))[0]
    rows, rejects, seen = [], [], set()
    with open(args.input, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                row = row_of_line(decode_line(raw), args, is_jsonl)
                identity = (row["text"], row["translation"])
                if identity in seen:
                    raise RejectedLine("duplicate", "the same text (pair) appeared on an earlier line")
                seen.add(identity)
            except RejectedLine as error:
                rejects.append({"line": number, "reason": error.reason, "detail": str(error)})
                continue
            rows.append({"sample_key": f"{prefix}-{number:09d}", **row})
    return rows, rejects


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


def write_outputs(args, rows, rejects):
    """The parquet and OUT.rejects.jsonl, both atomically (temporaries of a killed run removed)."""
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    rejects_path = os.path.splitext(args.output)[0] + ".rejects.jsonl"
    remove_temporaries(args.output)
    remove_temporaries(rejects_path)
    with atomic_path(args.output) as temporary:
        pq.write_table(pa.Table.from_pylist(rows, schema=TEXT_SCHEMA), temporary)
    atomic_write_text(rejects_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejects))
    return rejects_path


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        check_args(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    rows, rejects = read_rows(args)
    if not rows:
        print(f"error: no usable line in {args.input} ({len(rejects)} rejected)", file=sys.stderr)
        sys.exit(1)
    rejects_path = write_outputs(args, rows, rejects)
    reasons = dict(collections.Counter(r["reason"] for r in rejects))
    logger.info("%s -> %s: %d %s, %d rejected %s (%s)", args.input, args.output, len(rows),
                "pairs" if args.paired else "sentences", len(rejects), reasons or "", rejects_path)


if __name__ == "__main__":
    run_command(main)
