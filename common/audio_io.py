"""Audio I/O shared by data preparation and loading: read any file to 16 kHz mono, Opus bytes in and out.

Everything goes through soundfile (libsndfile), which reads wav / flac / ogg (Vorbis, Opus) / mp3 and
writes Ogg Opus. Failures raise :class:`AudioError` with a short machine-readable ``reason`` (used to
count rejects) and a human-readable message.

Example
-------
>>> import numpy as np
>>> tone = np.sin(np.arange(16000) / 16000 * 2 * np.pi * 440).astype("float32")
>>> samples, rate = decode_opus(encode_opus(tone))
>>> rate, len(samples)
(16000, 16000)
"""

import io
import math
import os
import subprocess

import numpy as np
import scipy.signal
import soundfile as sf

SAMPLE_RATE = 16000


class AudioError(Exception):
    """An audio file that cannot be used; ``reason`` is a short tag such as ``missing_audio``."""

    def __init__(self, reason, message):
        super().__init__(message)
        self.reason = reason


def read_audio(path, start_s=None, end_s=None, target_rate=SAMPLE_RATE, max_duration_s=None):
    """Read ``path`` (optionally the segment [start_s, end_s) in seconds) as float32 mono at target_rate.

    Channels are averaged; other sample rates are resampled (polyphase, Kaiser window). Audio
    longer than ``max_duration_s`` is refused from its header, before decoding. Raises AudioError:
    missing_audio, empty_audio, undecodable_audio, truncated_audio, zero_length_audio, too_long.
    """
    info = _open_info(path)
    first = 0 if start_s is None else int(round(start_s * info.samplerate))
    last = info.frames if end_s is None else min(info.frames, int(round(end_s * info.samplerate)))
    if max_duration_s is not None and (last - first) / info.samplerate > max_duration_s:
        raise AudioError("too_long", f"{path}: {(last - first) / info.samplerate:.1f} s is longer than "
                         f"--max-duration {max_duration_s} s: cut it into segments or raise the limit")
    if end_s is not None and int(round(end_s * info.samplerate)) > info.frames + info.samplerate // 100:
        raise AudioError("segment_out_of_range", f"{path}: segment end {end_s} s is past the audio's end "
                         f"({info.frames / info.samplerate:.2f} s): fix the segments file")
    try:
        samples, _ = sf.read(path, start=first, stop=last, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, ValueError) as error:
        raise AudioError("undecodable_audio", f"{path}: cannot decode audio ({error})") from error
    if end_s is None and len(samples) < info.frames:
        raise AudioError("truncated_audio", f"{path}: decoded {len(samples)} of {info.frames} frames")
    if len(samples) == 0:
        raise AudioError("zero_length_audio", f"{path}: holds no audio samples")
    return to_mono_rate(samples, info.samplerate, target_rate)


def read_audio_command(command, timeout_s, start_s=None, end_s=None, target_rate=SAMPLE_RATE, max_duration_s=None):
    """Run a shell ``command`` that writes audio to stdout (a Kaldi ``wav.scp`` pipe such as
    ``flac -c -d -s a.flac``) and read its output like ``read_audio`` reads a file (the segment
    [start_s, end_s) when given). Raises AudioError: pipe_failed (non-zero exit, its stderr in the
    message), pipe_timeout, undecodable_audio, zero_length_audio, too_long."""
    try:
        result = subprocess.run(command, shell=True, capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as error:
        raise AudioError("pipe_timeout", f"{command!r} ran longer than {timeout_s} s: raise --pipe-timeout "
                         "or write the audio to files") from error
    if result.returncode != 0:
        stderr = result.stderr.decode("utf-8", "replace").strip()[-300:]
        raise AudioError("pipe_failed", f"{command!r} exited with {result.returncode}: {stderr}")
    try:
        samples, rate = sf.read(io.BytesIO(result.stdout), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, ValueError) as error:
        raise AudioError("undecodable_audio", f"{command!r} wrote no readable audio ({error})") from error
    first = 0 if start_s is None else int(round(start_s * rate))
    samples = samples[first:] if end_s is None else samples[first:int(round(end_s * rate))]
    if len(samples) == 0:
        raise AudioError("zero_length_audio", f"{command!r}: no audio samples (in the segment)")
    if max_duration_s is not None and len(samples) / rate > max_duration_s:
        raise AudioError("too_long", f"{command!r}: {len(samples) / rate:.1f} s is longer than --max-duration "
                         f"{max_duration_s} s: cut it into segments or raise the limit")
    return to_mono_rate(samples, rate, target_rate), rate


def to_mono_rate(samples, rate, target_rate=SAMPLE_RATE):
    """Average the channels of ``samples`` [frames, channels] and resample to ``target_rate`` (in float64:
    the ONNX runtime's numpy port of the filter then yields the same float32 samples, bit for bit, which
    matters because the Opus pass after it turns a one-ulp difference into an audible one)."""
    mono = samples.mean(axis=1) if samples.ndim == 2 else samples
    if rate != target_rate:
        common = math.gcd(int(rate), int(target_rate))
        mono = scipy.signal.resample_poly(mono.astype(np.float64), target_rate // common, int(rate) // common)
    return np.ascontiguousarray(mono, dtype=np.float32)


OPUS_KBPS_RANGE = (6.0, 256.0)  # libsndfile maps compression level 0..1 linearly onto 256..6 kbit/s


def encode_opus(samples, rate=SAMPLE_RATE, bitrate_kbps=None):
    """Encode float32 mono ``samples`` as Ogg Opus bytes: VBR around ``bitrate_kbps`` kbit/s
    (6-256), or libsndfile's default (about 26 kbit/s for noisy 16 kHz speech) when None."""
    options = {}
    if bitrate_kbps is not None:
        low, high = OPUS_KBPS_RANGE
        if not low <= bitrate_kbps <= high:
            raise ValueError(f"Opus bitrate {bitrate_kbps} kbit/s is outside {low:g}-{high:g}")
        options["compression_level"] = (high - bitrate_kbps) / (high - low)
    buffer = io.BytesIO()
    sf.write(buffer, np.clip(samples, -1.0, 1.0), rate, format="OGG", subtype="OPUS", **options)
    return buffer.getvalue()


def decode_opus(data):
    """Decode Ogg Opus ``data`` (bytes) to (float32 mono samples, sample rate)."""
    samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return samples.mean(axis=1) if samples.shape[1] > 1 else samples[:, 0], rate


def _open_info(path):
    if not os.path.isfile(path):
        raise AudioError("missing_audio", f"{path}: no such file: fix the path in the manifest")
    if os.path.getsize(path) == 0:
        raise AudioError("empty_audio", f"{path}: the file is empty (0 bytes)")
    try:
        info = sf.info(path)
    except (sf.LibsndfileError, RuntimeError) as error:
        raise AudioError("undecodable_audio", f"{path}: not a readable audio file ({error})") from error
    _check_not_truncated(path, info)
    return info


def _check_not_truncated(path, info):
    """libsndfile silently shortens truncated WAV and Ogg files; catch both from their headers."""
    if info.format in ("WAV", "WAVEX"):
        declared = _wav_declared_data_bytes(path)
        bytes_per_frame = info.channels * max(1, _subtype_bytes(info.subtype))
        if declared is not None and info.frames * bytes_per_frame < declared:
            raise AudioError("truncated_audio", f"{path}: WAV header declares {declared} data bytes "
                             f"but the file holds {info.frames * bytes_per_frame}: the file is cut off")
    elif info.format == "OGG" and not _ogg_has_end_of_stream(path):
        raise AudioError("truncated_audio", f"{path}: the Ogg stream has no end-of-stream page: "
                         "the file is cut off")


def _subtype_bytes(subtype):
    return {"PCM_U8": 1, "PCM_S8": 1, "PCM_16": 2, "PCM_24": 3, "PCM_32": 4, "FLOAT": 4,
            "DOUBLE": 8, "ULAW": 1, "ALAW": 1}.get(subtype, 0)


def _wav_declared_data_bytes(path):
    """The size the RIFF 'data' chunk header declares, or None when it cannot be found."""
    with open(path, "rb") as handle:
        header = handle.read(4096)
    position = header.find(b"data", 12)
    if position < 0 or position + 8 > len(header):
        return None
    declared = int.from_bytes(header[position + 4:position + 8], "little")
    return None if declared in (0, 0xFFFFFFFF) else declared  # streamed WAVs leave it unset


def _ogg_has_end_of_stream(path):
    with open(path, "rb") as handle:
        handle.seek(max(0, os.path.getsize(path) - 65536))
        tail = handle.read()
    last_page = tail.rfind(b"OggS")
    return last_page >= 0 and last_page + 5 < len(tail) and bool(tail[last_page + 5] & 0x04)
