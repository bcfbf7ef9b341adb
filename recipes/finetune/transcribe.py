#!/usr/bin/env python3
"""Transcribe recordings with a trained finetune experiment.

    python recipes/finetune/transcribe.py exp/finetune_demo recordings/          # a folder of audio
    python recipes/finetune/transcribe.py exp/finetune_demo a.wav b.mp3 --ctc_greedy
    python recipes/finetune/transcribe.py exp/finetune_demo test.jsonl --output hyps.jsonl

INPUT is audio files (any format, rate and channel count local/make_shards.py reads), folders of them
(searched recursively), manifests (JSONL / TSV) or Kaldi data folders (wav.scp, optional text and
segments). Each recording goes through the shards' Opus codec first, as the training audio did
(``--raw_audio``: not; on the demo the codec takes the WER from 37.9 to 34.2 %, the test stage's
figure). Decoding is the experiment's test stage's: its beam, CTC weight and language model
(``--lm_dir`` / ``--lm_weight`` add or change the LM). Prints ``key<TAB>hypothesis`` per recording in
input order; ``--output`` also writes them, as JSONL (``.jsonl``) or a Kaldi ``text`` file (any other
name). Recordings longer than the model's ``max_duration`` are cut at their quietest moments and the
pieces' texts joined. When inputs carry transcripts (a manifest's ``text``, a folder's ``.txt`` files,
a Kaldi ``text``), WER / CER are printed.

``--stream`` decodes as a live recognizer would (common/streaming.py): the audio arrives in chunks of
``--chunk_ms``, the conformer's state is carried from chunk to chunk (each chunk sees ``--left_chunks``
before it), a CTC prefix beam search (``--beam``) extends its n-best on each chunk, and each change of
the best prefix is written to stderr as ``partial<TAB>key<TAB>text``. At an endpoint (``--endpoint_ms``
of silence after speech, WeNet's rules) and at the end, the attention decoder and the LM rescore the
n-best with the config's weights; the segment goes to stderr as ``final<TAB>key<TAB>text`` and the
recording's segments, joined, to stdout as without ``--stream``. ``--ctc_greedy`` streams greedy CTC
instead (no rescoring, no endpoints). ``-`` as INPUT reads raw 16-bit
little-endian PCM, mono at 16 kHz, from stdin until it closes (``arecord -f S16_LE -r 16000 -c 1 |
transcribe.py EXP - --stream``), without the Opus pass. Streaming wants a model trained with
``chunk_training: True``, ``attention_type: RelPosMHAXL`` and ``normalize_type: causal``, ``global`` or
``frame``.

Unreadable recordings are named, skipped and counted; the exit status is 1 only when nothing could
be transcribed.
"""

import argparse
import itertools
import json
import logging
import os
import sys

import numpy as np

from common.atomic import atomic_write_text
from common.audio_io import SAMPLE_RATE, AudioError, decode_opus, encode_opus, read_audio
from common.corpora.readers import (
    AUDIO_EXTENSIONS,
    Entry,
    make_reject,
    read_corpus,
    reject_duplicate_keys,
    sanitize_key,
)
from common.inference import length_batches, load_trained, split_at_silences
from common.metrics import TranscriptMetrics
from common.streaming import Endpointer, StreamingBeamRecognizer, StreamingRecognizer
from common.user_errors import UserError, run_command
from recipes.finetune.onnx_transcribe import pcm_pieces  # the standalone runtime reads stdin the same way

logger = logging.getLogger("transcribe")
STDIN = "-"  # INPUT naming raw PCM on standard input (--stream)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exp_dir", help="a finetune experiment folder (holds hyperparams.yaml, averaged.ckpt)")
    parser.add_argument("inputs", nargs="+", help="audio files, folders, manifests (.jsonl/.tsv), Kaldi folders")
    parser.add_argument("--output", help="also write the hypotheses here: .jsonl, or Kaldi text otherwise")
    parser.add_argument("--ctc_greedy", action="store_true", help="greedy CTC instead of the joint beam search")
    parser.add_argument("--beam", type=int, default=None, help="beam size (default: the config's beam_size)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    parser.add_argument("--batch_seconds", type=float, default=120.0, help="padded seconds per decoded batch")
    parser.add_argument("--max_batch_size", type=int, default=32, help="recordings (pieces) per batch at most")
    parser.add_argument("--group_size", type=int, default=256,
                        help="recordings read into memory at a time (batches are made within a group)")
    parser.add_argument("--raw_audio", action="store_true",
                        help="decode the audio as it is; by default each recording first goes through the shards' "
                        "Opus codec, as the model's training audio did (an exported model decodes it as it is)")
    parser.add_argument("--tokenizer", default=None, help="the tokenizer, when not at the config's tokenizer_file")
    parser.add_argument("--lm_dir", default=None, help="a recipes/lm experiment: shallow fusion in the beam "
                        "search (default: the config's lm_dir)")
    parser.add_argument("--lm_weight", type=float, default=None, help="its weight (default: the config's)")
    parser.add_argument("--ctc_weight", type=float, default=None,
                        help="the CTC share of the joint score (default: the config's; with an LM, 0.6 and "
                             "--beam 16 measured best on the open corpus)")
    parser.add_argument("--stream", action="store_true", help="decode chunk by chunk (CTC prefix beam, attention "
                        "rescoring at endpoints), partial hypotheses on stderr; INPUT '-' reads raw 16-bit 16 kHz "
                        "mono PCM from stdin")
    parser.add_argument("--chunk_ms", type=float, default=640.0, help="--stream: audio per chunk (rounded to "
                        "whole encoder frames)")
    parser.add_argument("--left_chunks", type=int, default=16, help="--stream: chunks of past context each "
                        "chunk attends to")
    parser.add_argument("--endpoint_ms", type=float, default=1000.0, help="--stream: silence after speech that "
                        "ends a segment (its n-best is then rescored; WeNet's rule 2)")
    return parser.parse_args(argv)


def input_entries(paths):
    """``(entries, rejects)`` of every input: an audio file is one entry keyed by its name; a folder,
    manifest or Kaldi folder is read as local/make_shards.py reads it, transcripts optional."""
    entries, rejects = [], []
    for path in paths:
        if path.lower().endswith(AUDIO_EXTENSIONS):  # read (or named as missing) with the others
            stem = os.path.splitext(os.path.basename(path))[0]
            entries.append(Entry(sanitize_key(stem), path, None, path))
            continue
        if not os.path.exists(path):
            rejects.append(make_reject(None, path, "missing_input", "no such file or folder"))
            continue
        found, bad = read_corpus(path, text_required=False)
        if not found and not bad:
            logger.warning("%s holds no audio (%s)", path, ", ".join(AUDIO_EXTENSIONS))
        entries += found
        rejects += bad
    return reject_duplicate_keys(entries, rejects)


def read_group(entries, through_opus=False):
    """``(readable entries, waveforms, problems)``: each recording at 16 kHz mono (coded and decoded
    with Opus when ``through_opus``), or why it is skipped."""
    kept, waveforms, problems = [], [], []
    for entry in entries:
        try:
            waveform = read_audio(entry.audio, entry.start_s, entry.end_s)
            waveforms.append(decode_opus(encode_opus(waveform))[0] if through_opus else waveform)
            kept.append(entry)
        except AudioError as error:
            problems.append(f"{entry.key} ({entry.audio}): {error.reason}: {error}")
    return kept, waveforms, problems


def transcribe_group(trained, waveforms, args):
    """One text per waveform: long ones cut at silences, pieces decoded in length-sorted batches."""
    pieces, owners = [], []
    for index, waveform in enumerate(waveforms):
        for start, end in split_at_silences(waveform, trained.settings["max_duration"]):
            pieces.append(waveform[start:end])
            owners.append(index)
    texts = [""] * len(pieces)
    search = "ctc_greedy" if args.ctc_greedy else "beam"
    for batch in length_batches([len(p) for p in pieces], args.batch_seconds * SAMPLE_RATE, args.max_batch_size):
        for index, text in zip(batch, trained.transcribe([pieces[i] for i in batch], search, args.beam)):
            texts[index] = text
    joined = [[] for _ in waveforms]
    for owner, text in zip(owners, texts):
        if text:
            joined[owner].append(text)
    return [" ".join(parts) for parts in joined]


def transcribe_inputs(trained, entries, args):
    """``(results, problems)``: the entries read a group at a time and decoded offline, each printed."""
    results, problems = [], []
    for first in range(0, len(entries), args.group_size):
        kept, waveforms, bad = read_group(entries[first:first + args.group_size], through_opus=not args.raw_audio)
        for problem in bad:
            logger.warning("skipped %s", problem)
        problems += bad
        if kept:
            for entry, hyp in zip(kept, transcribe_group(trained, waveforms, args)):
                print(f"{entry.key}\t{hyp}", flush=True)
                results.append((entry, hyp))
    return results, problems


def chunk_frames(trained, chunk_ms):
    """Encoder frames per ``chunk_ms`` of audio (at least one)."""
    frames = max(1, round(chunk_ms / 1000 * trained.model.frames_per_second()))
    logger.info("streaming in chunks of %d encoder frames (%.0f ms)", frames, frames / trained.model.frames_per_second()
                * 1000)
    return frames


def make_recognizer(trained, frames, args):
    """A fresh recognizer of ``frames`` encoder frames per chunk: greedy CTC with ``--ctc_greedy``, else the
    CTC prefix beam search rescored with the experiment's decoding settings and LM."""
    if args.ctc_greedy:
        return StreamingRecognizer(trained.model, frames, args.left_chunks)
    settings = trained.settings
    endpointer = Endpointer(frame_ms=1000.0 / trained.model.frames_per_second(), trailing_silence_ms=args.endpoint_ms)
    return StreamingBeamRecognizer(
        trained.model, frames, args.left_chunks, beam_size=args.beam or settings["beam_size"],
        ctc_weight=settings["ctc_weight"], length_normalization=settings["length_normalization"], lm=trained.lm,
        lm_weight=settings["lm_weight"], prefix_ids=trained.prefix_ids, endpointer=endpointer)


def stream_one(trained, key, pieces, recognizer):
    """The text of one recording fed piece by piece (float32 arrays, read as they arrive) to a fresh
    ``recognizer``; each change of the hypothesis, and each rescored segment, is written to stderr."""
    decode, segments = trained.tokenizer.processor.decode, 0
    for piece in itertools.chain(pieces, [None]):  # None: the end of the recording
        if piece is None:
            changed = recognizer.push(np.zeros(0, dtype=np.float32), final=True)
        else:
            changed = recognizer.push(piece)
        for segment in recognizer.finals[segments:]:
            print(f"final\t{key}\t{decode(segment)}", file=sys.stderr, flush=True)
        segments = len(recognizer.finals)
        if changed and piece is not None:
            print(f"partial\t{key}\t{recognized_text(recognizer, decode)}", file=sys.stderr, flush=True)
    return recognized_text(recognizer, decode)


def recognized_text(recognizer, decode):
    """The recognizer's text so far: its closed segments' texts and the open segment's, joined by spaces
    (a segment ends at a silence, so it ends a word)."""
    closed = sum(len(segment) for segment in recognizer.finals)
    texts = [decode(segment) for segment in recognizer.finals] + [decode(recognizer.ids[closed:])]
    return " ".join(text for text in texts if text)


def chunk_pieces(waveform, piece_samples):
    """``waveform`` cut into consecutive pieces of ``piece_samples`` (the last one shorter)."""
    return (waveform[start:start + piece_samples] for start in range(0, len(waveform), piece_samples))


def stream_inputs(trained, entries, args):
    """``(results, problems)`` of --stream: each entry's recording (stdin for ``-``) fed in chunks."""
    piece_samples = int(round(args.chunk_ms / 1000 * SAMPLE_RATE))
    frames, results, problems = chunk_frames(trained, args.chunk_ms), [], []
    for entry in entries:
        if entry.audio == STDIN:
            pieces = pcm_pieces(sys.stdin.buffer, piece_samples)
        else:
            kept, waveforms, bad = read_group([entry], through_opus=not args.raw_audio)
            problems += bad
            for problem in bad:
                logger.warning("skipped %s", problem)
            if not kept:
                continue
            pieces = chunk_pieces(waveforms[0], piece_samples)
        hyp = stream_one(trained, entry.key, pieces, make_recognizer(trained, frames, args))
        results.append((entry, hyp))
        try:
            print(f"{entry.key}\t{hyp}", flush=True)
        except BrokenPipeError:  # the reader went away (``| head -1``): no one reads the other lines
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor the flush at exit
            logger.warning("standard output was closed: stopped after %s", entry.key)
            break
    return results, problems


def output_text(results, path):
    """The hypotheses as JSONL (``.jsonl``) or as a Kaldi text file."""
    if path.endswith(".jsonl"):
        return "".join(json.dumps({"key": e.key, "audio": e.audio, "text": hyp, **({"reference": e.text} if e.text
                                   else {})}, ensure_ascii=False) + "\n" for e, hyp in results)
    return "".join(f"{entry.key} {hyp}".rstrip() + "\n" for entry, hyp in results)


def score(results):
    """WER / CER over the results whose entries have a transcript; None when none has."""
    scored = [(entry, hyp) for entry, hyp in results if entry.text]
    if not scored:
        return None
    metrics = TranscriptMetrics()
    metrics.append([e.key for e, _ in scored], [hyp for _, hyp in scored], [e.text for e, _ in scored])
    return metrics.summary()


def main(argv):
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    if STDIN in args.inputs and not args.stream:
        raise UserError("transcribe.py: INPUT '-' (raw PCM on stdin) needs --stream")
    entries, rejects = input_entries([path for path in args.inputs if path != STDIN])
    if STDIN in args.inputs:
        entries.append(Entry("stdin", STDIN, None, "stdin"))
    for reject in rejects:
        logger.warning("skipped %s (%s): %s: %s", reject["key"] or "-", reject["origin"], reject["reason"],
                       reject["detail"])
    overrides = {key: getattr(args, key) for key in ("lm_dir", "lm_weight", "ctc_weight")
                 if getattr(args, key) is not None}
    trained = load_trained(args.exp_dir, args.device, args.tokenizer, **overrides)
    results, problems = (stream_inputs if args.stream else transcribe_inputs)(trained, entries, args)
    if args.output and results:
        atomic_write_text(args.output, output_text(results, args.output))
    skipped = len(rejects) + len(problems)
    search = ("streaming " if args.stream else "") + ("greedy CTC" if args.ctc_greedy else "CTC prefix beam "
                                                       "+ attention rescoring" if args.stream else "beam")
    logger.info("transcribed %d recording(s) with %s search; skipped %d%s", len(results), search, skipped,
                f"; wrote {args.output}" if args.output and results else "")
    figures = score(results)
    if figures:
        logger.info("against the inputs' transcripts (%d): WER %.2f %% | CER %.2f %%",
                    figures["num_utterances"], figures["wer"], figures["cer"])
    if not results:
        logger.error("nothing was transcribed: %d input(s) skipped (see the warnings above)", skipped)
        return 1
    return 0


if __name__ == "__main__":
    run_command(main, sys.argv[1:])
