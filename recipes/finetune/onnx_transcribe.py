#!/usr/bin/env python3
"""Transcribe recordings with an ONNX export (``export.py EXP OUT --onnx``), without the training stack.

    python recipes/finetune/onnx_transcribe.py exported/demo_asr a.wav b.flac recordings/
    python recipes/finetune/onnx_transcribe.py exported/demo_asr recordings/ --stream --chunk_ms 640
    python recipes/finetune/onnx_transcribe.py exported/demo_asr recordings/ --threads 2 --beam 8

Needs numpy, soundfile and onnxruntime only (no torch, SpeechBrain, SentencePiece or Tandem): this file
can be copied next to the exported folder and run in a fresh environment with
``pip install numpy soundfile onnxruntime``. INPUT is audio files or folders of them (searched
recursively). Each recording is read as ``transcribe.py`` reads it (channels averaged, resampled to the
model's rate with SciPy's ``resample_poly`` filter, then coded and decoded with Opus as the training
shards were; ``--raw_audio``: not), cut at its quietest moments when longer than the model was trained
on, and decoded with greedy CTC (as ``transcribe.py --ctc_greedy --max_batch_size 1`` does for the same
model), or, with ``--beam N``, SpeechBrain's CTC prefix beam search (ported to numpy) whose n-best the
exported attention decoder rescores with the experiment's CTC weight (as ``transcribe.py --stream``
rescores a segment; the LM is not exported). With ``--stream`` either search runs chunk by chunk as
``transcribe.py --stream`` runs it (the exported streaming graphs, the encoder's state carried across
chunks of ``--chunk_ms``; the beam's n-best rescored at each endpoint, WeNet's rules; partial hypotheses
and rescored segments to stderr; ``-`` reads raw 16-bit PCM from stdin). Prints ``key<TAB>hypothesis``
per recording in input order.

The parts that ``transcribe.py`` takes from SciPy, SentencePiece, SpeechBrain and Tandem (the resampling
filter, the Fbank's STFT, cutting at silences, piece-to-text, the prefix search, the streaming front end and
endpoint rules) are written here in numpy; tests/recipes/test_onnx_export.py and test_streaming.py check
each against the original.
"""

import argparse
import heapq
import io
import json
import logging
import os
import re
import sys

import numpy as np
import onnxruntime
import soundfile as sf

logger = logging.getLogger("onnx_transcribe")

CONFIG_FILE, ENCODER_FILE, DECODER_FILE = "onnx_config.json", "encoder.onnx", "decoder.onnx"  # export.py --onnx
FRONT_END_FILE, STEP_FILE = "stream_front_end.onnx", "stream_encoder.onnx"  # export.py --onnx, a streaming model
STDIN = "-"
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".opus", ".mp3", ".sph", ".aiff", ".aif")
KAISER_BETA = 5.0  # scipy.signal.resample_poly's default window, ('kaiser', 5.0)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", help="a folder written by recipes/finetune/export.py --onnx")
    parser.add_argument("inputs", nargs="+", help="audio files or folders of them")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument("--beam", type=int, default=0, help="CTC prefix beam of this size, its n-best rescored by "
                        "the attention decoder (as transcribe.py --stream; no LM; with --stream, at each "
                        "endpoint); 0: greedy CTC")
    parser.add_argument("--raw_audio", action="store_true",
                        help="decode the audio as it is, without the training shards' Opus pass")
    parser.add_argument("--stream", action="store_true", help="decode chunk by chunk, the encoder's state "
                        "carried across chunks, as transcribe.py --stream does (greedy CTC as its --ctc_greedy; "
                        "with --beam its CTC prefix beam rescored at endpoints); partial hypotheses and rescored "
                        "segments go to stderr; INPUT '-' reads raw 16-bit PCM, mono at the model's rate, from "
                        "stdin")
    parser.add_argument("--chunk_ms", type=float, default=640.0, help="--stream: audio per chunk (rounded to "
                        "whole encoder frames)")
    parser.add_argument("--left_chunks", type=int, default=16, help="--stream: chunks of past context each "
                        "chunk attends to")
    parser.add_argument("--endpoint_ms", type=float, default=1000.0, help="--stream --beam: silence after speech "
                        "that ends a segment (its n-best is then rescored; WeNet's rule 2)")
    args = parser.parse_args(argv)
    if STDIN in args.inputs and not args.stream:
        parser.error("INPUT '-' (raw PCM on stdin) needs --stream")
    return args


def lowpass_filter(up, down):
    """The anti-aliasing filter of ``scipy.signal.resample_poly(x, up, down)``: a windowed sinc
    (Kaiser, beta 5) of 20 * max(up, down) + 1 taps, cut at 1 / max(up, down) of Nyquist, gain ``up``."""
    rate = max(up, down)
    half_len = 10 * rate
    offsets = np.arange(2 * half_len + 1) - half_len
    taps = np.sinc(offsets / rate) / rate * np.kaiser(2 * half_len + 1, KAISER_BETA)
    return taps / taps.sum(), half_len


def resample_poly(samples, up, down, block=8192):
    """``samples`` (float64, 1-D; as transcribe.py's reader hands them to SciPy) resampled by ``up / down``
    (coprime) as ``scipy.signal.resample_poly`` does, to the same float32 samples, computed polyphase:
    output sample k sums the filter's phase (k * down) % up against the input samples ending at
    (k * down) // up."""
    taps, half_len = lowpass_filter(up, down)
    taps = (taps.astype(samples.dtype) * up).astype(np.float64)  # SciPy keeps the input's precision
    num_out = -(-len(samples) * up // down)
    start = (half_len + down - half_len % down) // down  # SciPy's n_pre_remove, in output samples
    shift = down - half_len % down  # its n_pre_pad: zeros before the filter
    taps = np.concatenate([np.zeros(shift), taps])
    per_phase = -(-len(taps) // up)
    phases = np.concatenate([taps, np.zeros(per_phase * up - len(taps))]).reshape(per_phase, up).T
    padded = np.concatenate([np.zeros(per_phase), samples.astype(np.float64), np.zeros(per_phase + 1)])
    out = np.empty(num_out)
    for first in range(0, num_out, block):
        positions = (np.arange(first, min(first + block, num_out)) + start) * down
        newest = positions // up + per_phase  # index in ``padded`` of the newest input sample used
        window = padded[newest[:, None] - np.arange(per_phase)[None, :]]
        out[first:first + len(positions)] = (window * phases[positions % up]).sum(axis=1)
    return out.astype(np.float32)


def to_mono_rate(samples, rate, target_rate):
    """Channels ([frames, channels]) averaged, resampled to ``target_rate`` (transcribe.py's reading)."""
    mono = samples.mean(axis=1) if samples.ndim == 2 else samples
    if rate != target_rate:
        common = np.gcd(int(rate), int(target_rate))
        mono = resample_poly(mono.astype(np.float64), target_rate // common, int(rate) // common)
    return np.ascontiguousarray(mono, dtype=np.float32)


def opus_pass(samples, rate):
    """``samples`` coded and decoded with Ogg Opus at libsndfile's default bitrate, as the shards hold
    the training audio."""
    buffer = io.BytesIO()
    sf.write(buffer, np.clip(samples, -1.0, 1.0), rate, format="OGG", subtype="OPUS")
    decoded, _ = sf.read(io.BytesIO(buffer.getvalue()), dtype="float32", always_2d=True)
    return decoded.mean(axis=1) if decoded.shape[1] > 1 else decoded[:, 0]


def read_recording(path, rate, through_opus=True):
    """The recording at ``path`` as float32 mono at ``rate`` (through Opus unless told not)."""
    samples, file_rate = sf.read(path, dtype="float32", always_2d=True)
    if len(samples) == 0:
        raise ValueError(f"{path}: holds no audio samples")
    mono = to_mono_rate(samples, file_rate, rate)
    return opus_pass(mono, rate) if through_opus else mono


def power_spectrum(samples, features):
    """|STFT|² frames [frames, n_fft / 2 + 1] as SpeechBrain's Fbank computes them before its mel
    filterbank: centred (``n_fft / 2`` zeros each side), its window, one frame per ``hop`` samples."""
    n_fft, hop = features["n_fft"], features["hop_length"]
    padded = np.pad(samples.astype(np.float32), n_fft // 2)
    count = 1 + (len(padded) - n_fft) // hop
    frames = padded[np.arange(n_fft)[None, :] + hop * np.arange(count)[:, None]]
    spectrum = np.fft.rfft(frames * np.asarray(features["window"], dtype=np.float32), n=n_fft)
    return (spectrum.real ** 2 + spectrum.imag ** 2).astype(np.float32)


def split_at_silences(samples, max_seconds, rate, frame_seconds=0.025, search_from=0.5):
    """``[(start, end), ...]`` ranges of ``samples`` no longer than ``max_seconds``, cut at the quietest
    25 ms frame of the last half of each window (common.inference.split_at_silences)."""
    limit, frame = int(max_seconds * rate), max(1, int(frame_seconds * rate))
    ranges, start = [], 0
    while len(samples) - start > limit:
        window = samples[start + int(limit * search_from):start + limit]
        frames = len(window) // frame
        energy = np.square(window[:frames * frame].reshape(frames, frame)).mean(axis=1)
        cut = start + int(limit * search_from) + int(np.argmin(energy)) * frame + frame // 2
        ranges.append((start, cut))
        start = cut
    ranges.append((start, len(samples)))
    return ranges


def ctc_greedy(log_probs, blank):
    """Best token per frame ([frames, vocab]), repeats collapsed, blanks dropped."""
    best = log_probs.argmax(axis=-1)
    keep = np.ones(len(best), dtype=bool)
    keep[1:] = best[1:] != best[:-1]
    return [int(token) for token in best[keep] if token != blank]


class Prefix:
    """One CTC prefix: its log-probabilities ending in blank / not in blank, before and after a frame."""

    def __init__(self, ids):
        self.ids, self.p_b, self.p_nb, self.next_b, self.next_nb = ids, -np.inf, -np.inf, -np.inf, -np.inf
        self.score = -np.inf  # log(p_b + p_nb) of the frames so far

    def step(self):
        self.p_b, self.p_nb, self.next_b, self.next_nb = self.next_b, self.next_nb, -np.inf, -np.inf
        self.score = float(np.logaddexp(self.p_b, self.p_nb))


class PrefixBeam:
    """SpeechBrain's ``CTCPrefixBeamSearcher`` (no LM, no history pruning) carried across calls:
    ``extend(log_probs)`` adds frames ([frames, vocab]) as its ``partial_decoding`` does, ``nbest()`` is
    what its ``finalize_decoding`` returns. Each frame extends the prefixes with the tokens above
    ``token_prune`` (and the best one), keeps those within ``beam_prune`` of the best, then the
    ``beam_size`` best (ties: the older first); ``prefixes`` stay best first."""

    def __init__(self, blank, beam_size, token_prune=-5.0, beam_prune=-10.0):
        self.blank, self.beam_size, self.token_prune, self.beam_prune = blank, beam_size, token_prune, beam_prune
        start = Prefix(())
        start.p_b, start.score = 0.0, 0.0
        self.prefixes = [start]

    def extend(self, log_probs):
        prefixes = self.prefixes
        for column in log_probs:
            tokens = sorted(set(np.flatnonzero(column > self.token_prune).tolist()) | {int(column.argmax())})
            by_ids, current = {prefix.ids: prefix for prefix in prefixes}, list(prefixes)
            for token in tokens:
                p = float(column[token])
                for prefix in current:
                    if token == self.blank:
                        prefix.next_b = float(np.logaddexp(prefix.next_b, prefix.score + p))
                        continue
                    last = prefix.ids[-1] if prefix.ids else None
                    if token == last:
                        prefix.next_nb = float(np.logaddexp(prefix.next_nb, prefix.p_nb + p))
                    ids = prefix.ids + (token,)
                    if ids not in by_ids:
                        by_ids[ids] = Prefix(ids)
                        prefixes.append(by_ids[ids])
                    extended = by_ids[ids]
                    if token == last and prefix.p_b > -np.inf:
                        extended.next_nb = float(np.logaddexp(extended.next_nb, prefix.p_b + p))
                    elif token != last:
                        extended.next_nb = float(np.logaddexp(extended.next_nb, prefix.score + p))
            for prefix in prefixes:
                prefix.step()
            prefixes = best_prefixes(prefixes, self.beam_size, self.beam_prune)
        self.prefixes = prefixes

    @property
    def best(self):
        """The best prefix's token ids."""
        return list(self.prefixes[0].ids)

    def nbest(self):
        """``[(ids, CTC log-probability)]`` of the hypotheses that are not empty, best first."""
        return [(list(prefix.ids), prefix.score)
                for prefix in best_prefixes(self.prefixes, self.beam_size, self.beam_prune) if prefix.ids]


def ctc_prefix_beam(log_probs, blank, beam_size):
    """``PrefixBeam``'s n-best over one recording's ``log_probs`` [frames, vocab]."""
    search = PrefixBeam(blank, beam_size)
    search.extend(log_probs)
    return search.nbest()


def best_prefixes(prefixes, beam_size, beam_prune):
    """The ``beam_size`` highest-scoring prefixes within ``beam_prune`` of the best, best first."""
    best = max(prefix.score for prefix in prefixes)
    kept = [prefix for prefix in prefixes if prefix.score >= best + beam_prune]
    return heapq.nlargest(beam_size, kept, key=lambda prefix: prefix.score)


def detokenize(ids, tokens):
    """Token ids → text as SentencePiece decodes them: control pieces dropped, the unknown piece written
    " ⁇ ", every "▁" before the first other character removed and every later one read as a space."""
    skip, unknown = set(tokens["control_ids"]), tokens["unk_id"]
    pieces = [" ⁇ " if i == unknown else tokens["pieces"][i] for i in ids if i not in skip]
    text = "".join(pieces)
    return (text if pieces and pieces[0] == " ⁇ " else text.lstrip("▁")).replace("▁", " ")


class OnnxTranscriber:
    """An exported model on onnxruntime: ``transcribe(samples)`` → text (float32 mono at its rate)."""

    def __init__(self, model_dir, threads=1):
        config_path = os.path.join(model_dir, CONFIG_FILE)
        if not os.path.isfile(config_path):
            raise FileNotFoundError(f"{config_path} is missing: export the model with "
                                    "recipes/finetune/export.py EXP OUT --onnx")
        with open(config_path, encoding="utf-8") as handle:
            self.config = json.load(handle)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.encoder = onnxruntime.InferenceSession(os.path.join(model_dir, ENCODER_FILE), options,
                                                    providers=["CPUExecutionProvider"])
        decoder_path = os.path.join(model_dir, DECODER_FILE)
        self.decoder = None  # exports before the decoder was exported decode greedily only
        if os.path.isfile(decoder_path) and "decoding" in self.config:
            self.decoder = onnxruntime.InferenceSession(decoder_path, options, providers=["CPUExecutionProvider"])
        self.model_dir, self.front_end, self.step = model_dir, None, None  # the streaming graphs, when exported
        if "streaming" in self.config:
            self.front_end, self.step = (onnxruntime.InferenceSession(os.path.join(model_dir, name), options,
                                                                      providers=["CPUExecutionProvider"])
                                         for name in (FRONT_END_FILE, STEP_FILE))

    @property
    def sample_rate(self):
        return self.config["features"]["sample_rate"]

    def streaming_recognizer(self, chunk_ms, left_chunks, beam_size=0, endpoint_ms=1000.0):
        """A fresh recognizer of chunks of ``chunk_ms`` (whole encoder frames, at least one): greedy CTC, or
        with ``beam_size`` the CTC prefix beam rescored at endpoints (``StreamingBeamRecognizer``)."""
        if self.step is None:
            raise ValueError(f"{self.model_dir} holds no streaming graphs: the model was not trained to stream "
                             "(chunk_training: True, attention_type: RelPosMHAXL, normalize_type: causal, global "
                             "or frame) or was exported before export.py --onnx wrote them")
        frames = max(1, round(chunk_ms / self.config["streaming"]["frame_ms"]))
        if not beam_size:
            return StreamingRecognizer(self, frames, left_chunks)
        self.check_decoder("--beam")
        endpointer = Endpointer(self.config["streaming"]["frame_ms"], trailing_silence_ms=endpoint_ms)
        return StreamingBeamRecognizer(self, frames, left_chunks, beam_size, endpointer)

    def check_decoder(self, option):
        if self.decoder is None:
            raise ValueError(f"{option} needs {DECODER_FILE} and the decoding settings, which this export lacks: "
                             "export the model again with recipes/finetune/export.py EXP OUT --onnx")

    def stream(self, key, pieces, recognizer):
        """The text of one recording fed piece by piece to a fresh ``recognizer``; each change of its
        hypothesis goes to stderr as ``partial<TAB>key<TAB>text``, each rescored segment as
        ``final<TAB>key<TAB>text`` (transcribe.py --stream's lines)."""
        segments = 0
        for piece in pieces:
            changed = recognizer.push(piece)
            segments = self.print_finals(key, recognizer, segments)
            if changed:
                print(f"partial\t{key}\t{self.text(recognizer)}", file=sys.stderr, flush=True)
        recognizer.push(np.zeros(0, dtype=np.float32), final=True)
        self.print_finals(key, recognizer, segments)
        return self.text(recognizer)

    def print_finals(self, key, recognizer, printed):
        """Prints the segments closed since the first ``printed``; returns how many are closed."""
        for segment in recognizer.finals[printed:]:
            print(f"final\t{key}\t{detokenize(segment, self.config['tokens'])}", file=sys.stderr, flush=True)
        return len(recognizer.finals)

    def text(self, recognizer):
        """The recognizer's text so far: each closed segment's text and the open one's, joined by spaces."""
        closed = sum(len(segment) for segment in recognizer.finals)
        texts = [detokenize(ids, self.config["tokens"]) for ids in [*recognizer.finals, recognizer.ids[closed:]]]
        return " ".join(text for text in texts if text)

    def encode(self, samples):
        """(CTC log-probabilities [frames, vocab], encoder states [1, frames, d_model]) of one piece."""
        spectrum = power_spectrum(samples, self.config["features"])[None]
        log_probs, enc_states = self.encoder.run(["ctc_log_probs", "enc_states"], {"power_spectrum": spectrum})
        return log_probs[0], enc_states

    def ctc_log_probs(self, samples):
        """CTC log-probabilities [frames, vocab] of one recording piece."""
        return self.encode(samples)[0]

    def beam_search(self, log_probs, enc_states, beam_size):
        """The best of the CTC prefix beam's n-best ([frames, vocab]) rescored with the attention decoder
        (``rescore``)."""
        return self.rescore(ctc_prefix_beam(self.search_log_probs(log_probs), self.config["tokens"]["blank_id"],
                                            beam_size), enc_states)

    def search_log_probs(self, log_probs):
        """``log_probs`` as the prefix search reads them: <s> and </s>, never CTC targets, kept out."""
        log_probs = log_probs.copy()
        log_probs[:, [self.config["tokens"]["bos_id"], self.config["tokens"]["eos_id"]]] = -np.inf
        return log_probs

    def rescore(self, nbest, enc_states):
        """The ids of the best of ``nbest`` (``[(ids, CTC log-probability)]``, none empty; [] for no
        hypothesis) rescored over ``enc_states`` [1, frames, d_model] as transcribe.py --stream
        rescores a segment: ``ctc_weight * CTC + (1 - ctc_weight) * attention`` log-probabilities of the
        hypothesis and </s>, divided by their count with ``length_normalization``."""
        settings, bos, eos = self.config["decoding"], self.config["tokens"]["bos_id"], self.config["tokens"]["eos_id"]
        if not nbest:
            return []
        prefix = [bos] + settings["prefix_ids"]
        width = max(len(ids) for ids, _ in nbest) + 1
        inputs = np.full((len(nbest), len(prefix) + width - 1), eos, dtype=np.int64)
        for row, (ids, _) in enumerate(nbest):
            inputs[row, :len(prefix) + len(ids)] = prefix + ids
        att = self.decoder.run(["log_probs"], {"tokens": inputs, "enc_states": np.repeat(enc_states, len(nbest), 0)})[0]
        scores = []
        for row, (ids, ctc_score) in enumerate(nbest):
            steps = att[row, len(prefix) - 1:len(prefix) + len(ids)]
            attention = float(steps[np.arange(len(ids) + 1), ids + [eos]].sum())
            score = settings["ctc_weight"] * ctc_score + (1.0 - settings["ctc_weight"]) * attention
            scores.append(score / (len(ids) + 1) if settings["length_normalization"] else score)
        return nbest[int(np.argmax(scores))][0]

    def transcribe(self, samples, beam_size=None):
        """The text of one recording (greedy CTC; with ``beam_size``, the rescored CTC prefix beam), pieces
        longer than the model's ``max_duration`` decoded apart."""
        if beam_size:
            self.check_decoder("--beam")
        texts = []
        for start, end in split_at_silences(samples, self.config["max_duration"], self.sample_rate):
            log_probs, enc_states = self.encode(samples[start:end])
            if beam_size:
                ids = self.beam_search(log_probs, enc_states, beam_size)
            else:
                ids = ctc_greedy(log_probs, self.config["tokens"]["blank_id"])
            texts.append(detokenize(ids, self.config["tokens"]))
        return " ".join(text for text in texts if text)


class StreamingFrontEnd:
    """``common.streaming.StreamingFrontEnd`` in numpy around ``stream_front_end.onnx``: waveform pieces
    → front-end frames [1, frames, channels, bins], each emitted once, as soon as the audio it depends
    on (``radius`` samples each side) has arrived; each window is the new audio plus ``margin`` samples
    before it. With causal statistics it carries the sums of every Fbank frame once its samples are in."""

    def __init__(self, session, features, settings):
        self.session, self.features, self.settings = session, features, settings
        self.stride, self.radius = settings["stride"], settings["radius"]
        self.margin = -(-self.radius // self.stride) * self.stride
        self.samples, self.first_sample, self.emitted = np.zeros(0, dtype=np.float32), 0, 0
        n_mels = session.get_inputs()[3].shape[0] if settings["causal"] else 0
        self.sums, self.sums_base = [(0.0, np.zeros(n_mels), np.zeros(n_mels))], 0

    def push(self, samples, final=False):
        """The frames made complete by ``samples`` (float32, 1-D); with ``final``, all that remain."""
        self.samples = np.concatenate([self.samples, np.asarray(samples, dtype=np.float32)])
        total = self.first_sample + len(self.samples)
        complete = max(0, (total - 1 - self.radius) // self.stride + 1)
        if total == 0 or (complete <= self.emitted and not final):
            return None
        start = max(0, self.emitted * self.stride - self.margin)
        power = power_spectrum(self.samples[start - self.first_sample:], self.features)[None]
        if self.settings["causal"]:
            frames = self.causal_frames(power, start, total, final)
        else:
            frames = self.session.run(["frames"], {"power_spectrum": power})[0]
        offset = start // self.stride
        last = offset + frames.shape[1] if final else complete
        out = frames[:, self.emitted - offset:last - offset]
        self.emitted = last
        keep_from = max(0, self.emitted * self.stride - self.margin)
        self.samples, self.first_sample = self.samples[keep_from - self.first_sample:], keep_from
        return out if out.shape[1] else None

    def causal_frames(self, power, start, total, final):
        """The window's front-end frames, its Fbank frames normalized with the sums of the frames before
        its first exact one (whose STFT window lies inside the audio kept); complete frames join the sums."""
        hop, half_window = self.settings["hop"], self.settings["half_window"]
        first = start // hop
        exact = first if start == 0 else first + -(-half_window // hop)
        count, total_sum, squares = self.sums[exact - self.sums_base]
        frames, raw = self.session.run(["frames", "fbank"], {
            "power_spectrum": power, "first": np.array(exact - first, dtype=np.int64),
            "count": np.array(count, dtype=np.float64), "total": total_sum, "squares": squares})
        known = self.sums_base + len(self.sums) - 1  # frames counted so far
        last = first + raw.shape[1] if final else max(known, (total - half_window) // hop + 1)
        for frame in raw[0, known - first:last - first].astype(np.float64):
            count, total_sum, squares = self.sums[-1]
            self.sums.append((count + 1, total_sum + frame, squares + frame * frame))
        keep = max(0, first - self.sums_base)
        self.sums, self.sums_base = self.sums[keep:], self.sums_base + keep
        return frames


class StreamingRecognizer:
    """Greedy CTC on audio pieces (``common.streaming.StreamingRecognizer`` on onnxruntime): front-end
    frames gathered into chunks of ``chunk_frames``, each through ``stream_encoder.onnx`` with every
    layer's context of the ``left_chunks`` chunks before it. ``ids``: the hypothesis so far; ``finals``:
    the ids of each closed segment (greedy CTC closes none)."""

    def __init__(self, transcriber, chunk_frames, left_chunks):
        self.transcriber, self.chunk_frames = transcriber, chunk_frames
        self.context_frames = left_chunks * chunk_frames
        self.front_end = StreamingFrontEnd(transcriber.front_end, transcriber.config["features"],
                                           transcriber.config["streaming"])
        layers, _, _, d_model = transcriber.step.get_inputs()[1].shape
        self.attention_context = np.zeros((layers, 1, 0, d_model), dtype=np.float32)
        self.conv_context = np.zeros((layers, 1, 0, d_model), dtype=np.float32)
        self.pending = None  # front-end frames waiting for a full chunk
        self.blank = transcriber.config["tokens"]["blank_id"]
        self.ids, self.previous, self.finals = [], self.blank, []

    def push(self, samples, final=False):
        """Feed ``samples``; with ``final``, the recording ends and its last, shorter chunk is decoded.
        Returns whether the hypothesis changed."""
        frames = self.front_end.push(samples, final)
        if frames is not None:
            self.pending = frames if self.pending is None else np.concatenate([self.pending, frames], axis=1)
        before = list(self.ids)
        while self.pending is not None and (self.pending.shape[1] >= self.chunk_frames or final):
            chunk, rest = self.pending[:, :self.chunk_frames], self.pending[:, self.chunk_frames:]
            self.pending = rest if rest.shape[1] else None
            self.decode_chunk(*self.encode_chunk(np.ascontiguousarray(chunk)))
        if final:
            self.finish()
        return self.ids != before

    def encode_chunk(self, frames):
        """(CTC log-probabilities [frames, vocab], encoder states [1, frames, d_model]) of one chunk, each
        layer's context carried to the next."""
        log_probs, enc_states, attention_inputs, self.conv_context = self.transcriber.step.run(None, {
            "frames": frames, "attention_context": self.attention_context, "conv_context": self.conv_context})
        kept = attention_inputs.shape[2] - min(self.context_frames, attention_inputs.shape[2])
        self.attention_context = np.ascontiguousarray(attention_inputs[:, :, kept:])
        return log_probs[0], enc_states

    def decode_chunk(self, log_probs, enc_states):
        for token in log_probs.argmax(axis=-1).tolist():
            if token != self.previous and token != self.blank:
                self.ids.append(token)
            self.previous = token

    def finish(self):
        """The recording has ended (greedy CTC has nothing left to do)."""


class Endpointer:
    """``common.streaming.Endpointer``: WeNet's endpoint rules on the CTC blank, checked after each chunk. A
    frame is silent when its blank probability exceeds ``blank_threshold``; a segment ends after
    ``no_speech_ms`` of silence with nothing decoded, after ``trailing_silence_ms`` of silence once something
    is decoded, or when it has lasted ``max_segment_ms`` with something decoded."""

    def __init__(self, frame_ms, blank_threshold=0.8, no_speech_ms=5000.0, trailing_silence_ms=1000.0,
                 max_segment_ms=20000.0):
        self.frame_ms, self.log_threshold = frame_ms, float(np.log(blank_threshold))
        self.no_speech_ms, self.trailing_silence_ms, self.max_segment_ms = (no_speech_ms, trailing_silence_ms,
                                                                            max_segment_ms)
        self.reset()

    def reset(self):
        self.frames, self.trailing = 0, 0  # frames in the segment; silent frames at its end

    def step(self, blank_log_probs, decoded):
        """Counts a chunk's frames (their blank log-probabilities, 1-D); whether the segment ends here."""
        for silent in (blank_log_probs > self.log_threshold).tolist():
            self.trailing = self.trailing + 1 if silent else 0
        self.frames += len(blank_log_probs)
        silence_ms, length_ms = self.trailing * self.frame_ms, self.frames * self.frame_ms
        if not decoded:
            return silence_ms >= self.no_speech_ms
        return silence_ms >= self.trailing_silence_ms or length_ms >= self.max_segment_ms


class StreamingBeamRecognizer(StreamingRecognizer):
    """``common.streaming.StreamingBeamRecognizer`` without an LM: the CTC prefix beam (``PrefixBeam``)
    extended chunk by chunk, an ``Endpointer`` closing segments, each segment's n-best rescored by the
    attention decoder over the segment's encoder states (``OnnxTranscriber.rescore``). ``ids``: the
    rescored segments, then the best prefix of the open one."""

    def __init__(self, transcriber, chunk_frames, left_chunks, beam_size, endpointer):
        super().__init__(transcriber, chunk_frames, left_chunks)
        self.beam_size, self.endpointer = beam_size, endpointer
        self.start_segment()

    def start_segment(self):
        self.search = PrefixBeam(self.blank, self.beam_size)
        self.segment_states = []
        self.endpointer.reset()

    def decode_chunk(self, log_probs, enc_states):
        log_probs = self.transcriber.search_log_probs(log_probs)
        self.search.extend(log_probs)
        self.segment_states.append(enc_states)
        best = self.search.best
        self.ids = [token for segment in self.finals for token in segment] + best
        if self.endpointer.step(log_probs[:, self.blank], bool(best)):
            self.end_segment()

    def finish(self):
        if self.segment_states:
            self.end_segment()

    def end_segment(self):
        """Rescore the segment's n-best, keep the best, start a new segment."""
        nbest = self.search.nbest()
        if nbest:
            self.finals.append(self.transcriber.rescore(nbest, np.concatenate(self.segment_states, axis=1)))
        self.ids = [token for segment in self.finals for token in segment]
        self.start_segment()


def pcm_pieces(stream, piece_samples):
    """Float32 pieces of raw 16-bit little-endian PCM read from a binary ``stream`` until it closes (the
    last piece shorter; an odd byte left at the end is dropped)."""
    carry = b""
    while data := stream.read(piece_samples * 2):
        data = carry + data
        usable = len(data) - len(data) % 2
        carry = data[usable:]
        if usable:
            yield np.frombuffer(data[:usable], dtype="<i2").astype(np.float32) / 32768.0
    if carry:
        logger.warning("stdin ended in the middle of a 16-bit sample: its last byte was dropped")


def audio_files(inputs):
    """``[(key, path)]`` of the inputs: files as given, folders' audio files sorted, recursively."""
    found = []
    for path in inputs:
        if os.path.isdir(path):
            found += sorted(os.path.join(root, name) for root, _, names in os.walk(path) for name in names
                            if name.lower().endswith(AUDIO_EXTENSIONS))
        else:
            found.append(path)
    return [(re.sub(r"[^A-Za-z0-9_\-]", "_", os.path.splitext(os.path.basename(p))[0]), p) for p in found]


def main(argv):
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    transcriber = OnnxTranscriber(args.model_dir, args.threads)
    if args.stream and transcriber.step is None:
        logger.error("--stream: %s holds no %s / %s: export a model that streams (chunk_training: True, "
                     "attention_type: RelPosMHAXL, normalize_type: causal, global or frame) with "
                     "recipes/finetune/export.py EXP OUT --onnx", args.model_dir, FRONT_END_FILE, STEP_FILE)
        return 2
    if args.beam and transcriber.decoder is None:
        logger.error("--beam: %s holds no %s or decoding settings: export the model again with "
                     "recipes/finetune/export.py EXP OUT --onnx", args.model_dir, DECODER_FILE)
        return 2
    piece_samples = int(round(args.chunk_ms / 1000 * transcriber.sample_rate))

    def new_recognizer():
        return transcriber.streaming_recognizer(args.chunk_ms, args.left_chunks, args.beam, args.endpoint_ms)

    inputs = [path for path in args.inputs if path != STDIN]
    done = skipped = 0
    for key, path in audio_files(inputs) + ([("stdin", STDIN)] if STDIN in args.inputs else []):
        if path == STDIN:
            text = transcriber.stream(key, pcm_pieces(sys.stdin.buffer, piece_samples), new_recognizer())
        else:
            try:
                samples = read_recording(path, transcriber.sample_rate, through_opus=not args.raw_audio)
            except (OSError, RuntimeError, ValueError, sf.LibsndfileError) as error:
                logger.warning("skipped %s (%s): %s", key, path, error)
                skipped += 1
                continue
            if args.stream:
                pieces = (samples[start:start + piece_samples] for start in range(0, len(samples), piece_samples))
                text = transcriber.stream(key, pieces, new_recognizer())
            else:
                text = transcriber.transcribe(samples, args.beam)
        try:
            print(f"{key}\t{text}", flush=True)
        except BrokenPipeError:  # the reader went away (``| head -1``): no one reads the other lines
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            logger.warning("standard output was closed: stopped after %s", key)
            break
        done += 1
    search = ("streaming " if args.stream else "") + (f"CTC prefix beam {args.beam} + attention rescoring"
                                                       if args.beam else "greedy CTC")
    logger.info("transcribed %d recording(s) with %s on onnxruntime; skipped %d", done, search, skipped)
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
