"""Audio I/O for shards: stream tar members with webdataset, decode Ogg Opus with soundfile.

A worker reads each of its shards front to back (``webdataset.tariterators.tar_file_iterator``) and
decodes only the members its plan asks for. A truncated tar or an undecodable member is skipped with a
warning and counted in ``BadDataCounts``; the epoch goes on.
"""

import logging
from collections import Counter

import numpy as np
import torch
import torchaudio.functional
from webdataset.tariterators import tar_file_iterator

from common.audio_io import SAMPLE_RATE, decode_opus

logger = logging.getLogger(__name__)


class BadDataCounts(Counter):
    """Counts of skipped data by kind (``truncated_shard``, ``undecodable``, ``missing``)."""

    def record(self, kind, message):
        """Count one problem and log it as a warning."""
        self[kind] += 1
        logger.warning("skipped (%s): %s", kind, message)


def decode_waveform(data):
    """Decode a shard's Ogg Opus member into a float32 waveform tensor at 16 kHz, shape [samples]."""
    waveform, rate = decode_opus(data)
    if rate != SAMPLE_RATE:
        raise ValueError(f"sample rate {rate} Hz, shards hold {SAMPLE_RATE} Hz audio: rewrite the shard")
    return torch.from_numpy(waveform)


def speed_perturb(waveform, speed):
    """Play ``waveform`` ``speed`` times faster (duration / speed); 1.0 returns it unchanged."""
    if speed == 1.0:
        return waveform
    return torchaudio.functional.resample(waveform, int(round(SAMPLE_RATE * speed)), SAMPLE_RATE)


def shard_members(path, bad_data):
    """Yield ``(key, extension, bytes)`` for each member of a shard tar, front to back.

    Keys hold no ``.`` (shard contract), so the key is the name up to the first dot. A truncated or
    unreadable tar ends the shard early with a counted warning.
    """
    try:
        with open(path, "rb") as stream:
            for member in tar_file_iterator(stream):
                key, _, extension = member["fname"].partition(".")
                yield key, extension, member["data"]
    except Exception as error:  # tarfile raises several types for damaged archives
        bad_data.record("truncated_shard", f"{path}: {error}")


def decoded_audio(path, wanted, bad_data, durations=None):
    """Yield ``(key, waveform)`` for the opus members of ``path`` whose key is in ``wanted``.

    Unwanted members are read past without decoding; an undecodable one is counted and skipped. With
    ``durations`` ({key: seconds}, from the metadata), so is one that decodes to another length.
    """
    for key, data in wanted_members(path, wanted, bad_data):
        waveform = decode_member(key, data, path, bad_data, None if durations is None else durations[key])
        if waveform is not None:
            yield key, waveform


def wanted_members(path, wanted, bad_data):
    """Yield ``(key, Opus bytes)`` for the opus members of ``path`` whose key is in ``wanted``."""
    for key, extension, data in shard_members(path, bad_data):
        if extension == "opus" and key in wanted:
            yield key, data


def decode_member(key, data, path, bad_data, seconds=None):
    """The waveform of one Opus member, or None when it cannot be decoded (counted, with a warning).

    With ``seconds`` (from the metadata), a member that decodes to another length counts as
    undecodable too: libsndfile silently drops an Ogg page whose checksum fails, so a corrupted member
    decodes short.
    """
    try:
        waveform = decode_waveform(data)
        if seconds is not None:
            check_duration(waveform, seconds)
        return waveform
    except Exception as error:  # soundfile raises RuntimeError / LibsndfileError on bad data
        bad_data.record("undecodable", f"{key} in {path}: {error}")
        return None


def check_duration(waveform, seconds):
    """Raises ValueError unless ``waveform`` (16 kHz) lasts ``seconds`` within one 20 ms Opus frame."""
    decoded_s = len(waveform) / SAMPLE_RATE
    if abs(decoded_s - seconds) > 0.02:
        raise ValueError(f"decodes to {decoded_s:.3f} s but the metadata says {seconds:.3f} s (a corrupted "
                         "Ogg page is dropped silently): rewrite the shard with local/make_shards.py")


def choose_speeds(count, speeds, rng):
    """One speed factor per utterance drawn uniformly from ``speeds`` (all 1.0 when none)."""
    if not speeds:
        return np.ones(count)
    return np.asarray(speeds, dtype=np.float64)[rng.integers(0, len(speeds), count)]
