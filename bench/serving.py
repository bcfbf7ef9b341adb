#!/usr/bin/env python3
"""Serving figures of one finetuned model: WER and real-time factor per search, runtime and thread count.

    python bench/serving.py exp/finetune_small data/open/test.jsonl [--threads 1 2] \\
        [--chunks_ms 1280 640 320] [--left_chunks 16] [--onnx_dir exported/small] [--json]

Rows: offline greedy CTC and joint CTC/attention beam search (torch), streaming greedy CTC and streaming
CTC prefix beam with attention rescoring at each chunk size (torch, transcribe.py --stream's recognizers,
common/streaming.py; skipped, with the reason, for a model that cannot stream) and, on onnxruntime,
offline greedy CTC and CTC prefix beam rescored by the decoder, and both streaming at each chunk size
(onnx_transcribe.py, no LM; the ``export.py --onnx`` folder ``--onnx_dir``, or one exported to a temporary
folder). Every row decodes the same
recordings (read once, through the shards' Opus pass, as ``transcribe.py`` reads them) one at a time,
with torch and onnxruntime held to the row's thread count.

Each row: WER with its bootstrap 95 % interval over utterances and CER (bench/stats.py), RTF = decoding
seconds / audio seconds (reading excluded). Streaming rows also give the WER ratio to the same search
offline (greedy to greedy; torch's beam to its joint beam search, onnxruntime's to its offline prefix beam +
rescoring) with its paired interval, the mean compute time per chunk, and two latencies, the audio played
in real time in ``chunk_ms`` pieces, each decoded when it has arrived and the previous one is done:

- first partial: from the end of the first word (the frame where offline greedy CTC emits its last
  token) until a partial hypothesis begins with that word's tokens, as offline greedy spells it
  (recordings where it never does, or whose offline hypothesis is empty, are left out; the row counts
  those kept); negative when the chunked encoder spells the word before offline greedy's frame;
- final: from the end of the audio (the end stands for an endpoint) until the final hypothesis (the beam
  rows' includes the rescoring).

INPUT is what ``transcribe.py`` takes; only recordings with a transcript are scored. With ``--json`` the
last line holds every row.
"""

import argparse
import itertools
import json
import logging
import os
import re
import sys
import tempfile
import time

import numpy as np
import torch

from bench import stats
from common.atomic import atomic_write_text
from common.audio_io import SAMPLE_RATE
from common.inference import load_trained
from common.streaming import check_streamable
from common.tokens import BLANK
from common.user_errors import UserError, run_command
from recipes.finetune import export, onnx_transcribe, transcribe

logger = logging.getLogger("serving")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exp_dir", help="a finetune experiment (hyperparams.yaml, averaged.ckpt)")
    parser.add_argument("inputs", nargs="+", help="manifests, folders or Kaldi folders with transcripts")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts to measure")
    parser.add_argument("--chunks_ms", type=float, nargs="+", default=[1280.0, 640.0, 320.0],
                        help="streaming chunk sizes (ms)")
    parser.add_argument("--left_chunks", type=int, default=16, help="streaming left context (chunks)")
    parser.add_argument("--beam", type=int, default=None, help="beam size (default: the config's)")
    parser.add_argument("--stream_searches", nargs="+", choices=("ctc_greedy", "beam"), default=["ctc_greedy", "beam"],
                        help="streaming rows: greedy CTC, and CTC prefix beam with attention rescoring")
    parser.add_argument("--endpoint_ms", type=float, default=1000.0, help="streaming beam: silence after speech "
                        "that ends a segment (transcribe.py's --endpoint_ms)")
    parser.add_argument("--onnx_dir", default=None, help="an export.py --onnx folder of the same experiment "
                        "(default: export one to a temporary folder)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the rows")
    parser.add_argument("--hyps_dir", default=None, help="also write each row's hypotheses there as "
                        "{key, hyp, ref} JSON lines (bench/stats.py read_scored), to compare models paired")
    return parser.parse_args(argv)


def scored_recordings(inputs):
    """``(entries, waveforms)`` of the inputs' recordings that have a transcript, read as transcribe.py
    reads them (16 kHz mono, through Opus)."""
    entries, rejects = transcribe.input_entries(inputs)
    entries = [entry for entry in entries if entry.text]
    kept, waveforms, problems = transcribe.read_group(entries, through_opus=True)
    for problem in [f"{r['origin']}: {r['reason']}" for r in rejects] + problems:
        logger.warning("skipped %s", problem)
    if not kept:
        raise UserError(f"serving.py: no readable recording with a transcript in {inputs}")
    return kept, waveforms


def row(name, threads, entries, hyps, seconds, audio_s, **extra):
    """One result row: WER (with its bootstrap interval) and CER of ``hyps`` against the entries'
    transcripts, and the real-time factor."""
    refs, by_key = {e.key: e.text for e in entries}, {e.key: hyp for e, hyp in zip(entries, hyps)}
    wer = stats.error_rate(stats.score(refs, by_key))
    cer = stats.error_rate(stats.score(refs, by_key, unit="char"))
    return {"row": name, "threads": threads, "wer": round(wer.value, 2), "wer_interval": wer.as_list(),
            "cer": round(cer.value, 2), "rtf": round(seconds / audio_s, 4), "hyps": by_key, **extra}


def wer_ratio(streamed, offline, refs):
    """``[ratio, low, high]``: WER(streamed) / WER(offline) with its paired bootstrap interval; None when
    offline made no error."""
    scored = [stats.score(refs, r["hyps"]) for r in (streamed, offline)]
    try:
        gain = stats.relative_gain(*scored)
    except ValueError:
        return None
    return [round(1.0 - gain.value, 4), round(1.0 - gain.high, 4), round(1.0 - gain.low, 4)]


def decode_offline(trained, waveforms, search, beam):
    """``(texts, seconds)``: each recording decoded alone with ``search``."""
    began, texts = time.perf_counter(), []
    for waveform in waveforms:
        texts += trained.transcribe([waveform], search, beam)
    return texts, time.perf_counter() - began


def first_word_tokens(ids, processor):
    """How many of ``ids`` (SentencePiece) spell the first word: up to the next piece that starts a word."""
    for index in range(1, len(ids)):
        if processor.id_to_piece(ids[index]).startswith("\u2581"):
            return index
    return len(ids)


@torch.no_grad()
def first_words(trained, waveforms):
    """Per recording, ``(ids, end_s)``: the tokens offline greedy CTC spells its first word with and when
    that word ends (the end of the frame emitting its last token); None for an empty hypothesis."""
    model, fps, words = trained.model, trained.model.frames_per_second(), []
    for waveform in waveforms:
        best = model.ctc_log_probs(model.encode(torch.as_tensor(waveform)[None], torch.ones(1)))[0].argmax(-1)
        frames, previous = [], BLANK
        for frame, token in enumerate(best.tolist()):
            if token not in (previous, BLANK):
                frames.append((frame, token))
            previous = token
        if not frames:
            words.append(None)
            continue
        count = first_word_tokens([token for _, token in frames], trained.tokenizer.processor)
        words.append(([token for _, token in frames[:count]], (frames[count - 1][0] + 1) / fps))
    return words


def torch_recognizers(trained, chunk_ms, args, search):
    """``(make, text)`` of transcribe.py's streaming recognizer of ``search`` (``ctc_greedy``, or ``beam``:
    CTC prefix beam with attention rescoring) at ``chunk_ms``: a factory and the recognizer's text."""
    frames = max(1, round(chunk_ms / 1000 * trained.model.frames_per_second()))
    options = argparse.Namespace(ctc_greedy=search == "ctc_greedy", left_chunks=args.left_chunks, beam=args.beam,
                                 endpoint_ms=args.endpoint_ms)
    return (lambda: transcribe.make_recognizer(trained, frames, options),
            lambda recognizer: transcribe.recognized_text(recognizer, trained.tokenizer.processor.decode))


def onnx_recognizers(runtime, chunk_ms, args, search):
    """``(make, text)`` of onnx_transcribe.py's streaming recognizer of ``search`` at ``chunk_ms`` (``beam``:
    CTC prefix beam rescored by the decoder at endpoints, no LM)."""
    beam_size = (args.beam or runtime.config["decoding"]["beam_size"]) if search == "beam" else 0
    return (lambda: runtime.streaming_recognizer(chunk_ms, args.left_chunks, beam_size, args.endpoint_ms),
            runtime.text)


def decode_streaming(recognizers, waveforms, words, chunk_ms):
    """``(texts, seconds, extra)``: each recording fed in ``chunk_ms`` pieces as if played in real time to a
    recognizer of ``recognizers`` (``(make, text)``); ``extra`` holds the mean compute time per chunk and
    the mean first-partial and final latencies (ms, see the module's docstring; ``words`` from
    ``first_words``)."""
    make, text_of = recognizers
    piece = int(round(chunk_ms / 1000 * SAMPLE_RATE))
    texts, chunk_times, first_partials, finals = [], [], [], []
    for waveform, word in zip(waveforms, words):
        recognizer, clock, first_partial = make(), 0.0, None
        pushes = [(waveform[start:start + piece], min(len(waveform), start + piece) / SAMPLE_RATE, False)
                  for start in range(0, len(waveform), piece)]
        for samples, arrival, final in pushes + [(np.zeros(0, dtype=np.float32), len(waveform) / SAMPLE_RATE, True)]:
            began = time.perf_counter()
            recognizer.push(samples, final=final)
            compute = time.perf_counter() - began
            chunk_times.append(compute)
            clock = max(clock, arrival) + compute  # when this piece's hypothesis is out
            if first_partial is None and word is not None and recognizer.ids[:len(word[0])] == word[0]:
                first_partial = clock - word[1]
        if first_partial is not None:
            first_partials.append(first_partial)
        finals.append(clock - len(waveform) / SAMPLE_RATE)
        texts.append(text_of(recognizer))
    extra = {"chunk_compute_ms": round(1000 * float(np.mean(chunk_times)), 1),
             "first_partial_latency_ms": round(1000 * float(np.mean(first_partials)), 1) if first_partials else None,
             "first_partial_utterances": len(first_partials),
             "final_latency_ms": round(1000 * float(np.mean(finals)), 1)}
    return texts, sum(chunk_times), extra


def decode_onnx(onnx_dir, waveforms, threads, beam_size=None):
    """``(texts, seconds)`` of onnx_transcribe.py on onnxruntime with ``threads`` threads: greedy CTC, or
    with ``beam_size`` the CTC prefix beam rescored by the decoder."""
    runtime = onnx_transcribe.OnnxTranscriber(onnx_dir, threads)
    began = time.perf_counter()
    texts = [runtime.transcribe(waveform, beam_size) for waveform in waveforms]
    return texts, time.perf_counter() - began


def measure(trained, entries, waveforms, args, onnx_dir):
    """Every row, per thread count (see the module's docstring)."""
    audio_s = sum(len(w) for w in waveforms) / SAMPLE_RATE
    try:
        check_streamable(trained.model, "streaming rows")
        chunks_ms = args.chunks_ms
    except ValueError as error:
        logger.warning("no streaming rows: %s", error)
        chunks_ms = []
    words = first_words(trained, waveforms) if chunks_ms else []
    refs, rows = {e.key: e.text for e in entries}, []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for search in ("ctc_greedy", "beam"):
            texts, seconds = decode_offline(trained, waveforms, search, args.beam)
            rows.append(row(f"torch offline {search}", threads, entries, texts, seconds, audio_s))
        offline = {"ctc_greedy": rows[-2], "beam": rows[-1]}
        for search, chunk_ms in itertools.product(args.stream_searches, chunks_ms):
            texts, seconds, extra = decode_streaming(torch_recognizers(trained, chunk_ms, args, search), waveforms,
                                                     words, chunk_ms)
            rows.append(row(f"torch streaming {search} {chunk_ms:.0f} ms", threads, entries, texts, seconds, audio_s,
                            **extra))
            rows[-1]["wer_vs_offline"] = wer_ratio(rows[-1], offline[search], refs)
        texts, seconds = decode_onnx(onnx_dir, waveforms, threads)
        rows.append(row("onnxruntime offline ctc_greedy", threads, entries, texts, seconds, audio_s))
        texts, seconds = decode_onnx(onnx_dir, waveforms, threads, args.beam or trained.settings["beam_size"])
        rows.append(row("onnxruntime offline prefix beam + rescoring", threads, entries, texts, seconds, audio_s))
        onnx_offline = {"ctc_greedy": rows[-2], "beam": rows[-1]}
        runtime = onnx_transcribe.OnnxTranscriber(onnx_dir, threads)
        for search, chunk_ms in itertools.product(args.stream_searches, chunks_ms):
            texts, seconds, extra = decode_streaming(onnx_recognizers(runtime, chunk_ms, args, search), waveforms,
                                                     words, chunk_ms)
            rows.append(row(f"onnxruntime streaming {search} {chunk_ms:.0f} ms", threads, entries, texts, seconds,
                            audio_s, **extra))
            rows[-1]["wer_vs_offline"] = wer_ratio(rows[-1], onnx_offline[search], refs)
        logger.info("%d thread(s) measured", threads)
    return rows, audio_s


def write_hyps(rows, refs, folder):
    """Each row's hypotheses as ``FOLDER/<row>_<threads>t.jsonl`` (``{key, hyp, ref}`` lines)."""
    os.makedirs(folder, exist_ok=True)
    for r in rows:
        name = re.sub(r"[^A-Za-z0-9]+", "_", r["row"]).strip("_") + f"_{r['threads']}t.jsonl"
        lines = "".join(json.dumps({"key": key, "hyp": hyp, "ref": refs[key]}, ensure_ascii=False) + "\n"
                        for key, hyp in r["hyps"].items())
        atomic_write_text(os.path.join(folder, name), lines)


def table(rows, audio_s):
    """The rows as a plain-text table (latencies and chunk compute in ms; ratio: WER / the same search's
    offline WER)."""
    lines = [f"{len(rows)} rows over {audio_s:.1f} s of audio (RTF: decoding seconds per audio second)",
             f"{'row':44} {'thr':>3} {'WER % [95 % interval]':>22} {'CER %':>6} {'RTF':>7} {'ratio':>6} "
             f"{'chunk':>6} {'first':>6} {'final':>6}"]
    for r in rows:
        low, high = r["wer_interval"]
        wer, ratio = f"{r['wer']:.2f} [{low:.2f}, {high:.2f}]", r.get("wer_vs_offline")
        lines.append(f"{r['row']:44} {r['threads']:>3} {wer:>22} "
                     f"{r['cer']:>6.2f} {r['rtf']:>7.4f} {'' if ratio is None else f'{ratio[0]:.2f}':>6} "
                     f"{r.get('chunk_compute_ms') or '':>6} {r.get('first_partial_latency_ms') or '':>6} "
                     f"{r.get('final_latency_ms') or '':>6}")
    return "\n".join(lines)


def main(argv):
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    entries, waveforms = scored_recordings(args.inputs)
    trained = load_trained(args.exp_dir)
    with tempfile.TemporaryDirectory() as scratch:
        onnx_dir = args.onnx_dir or export.export(args.exp_dir, os.path.join(scratch, "onnx"), onnx=True)
        rows, audio_s = measure(trained, entries, waveforms, args, onnx_dir)
    print(table(rows, audio_s))
    if args.hyps_dir:
        write_hyps(rows, {e.key: e.text for e in entries}, args.hyps_dir)
    if args.json:
        print(json.dumps({"audio_s": round(audio_s, 2), "rows": [{k: v for k, v in r.items() if k != "hyps"}
                                                                  for r in rows]}))
    return 0


if __name__ == "__main__":
    run_command(main, sys.argv[1:])
