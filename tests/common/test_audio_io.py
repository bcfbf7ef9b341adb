"""common/audio_io.py: conversion to 16 kHz mono and the Opus round trip."""

import numpy as np
import pytest
import soundfile as sf

from common.audio_io import AudioError, decode_opus, encode_opus, read_audio


def test_segment_read_is_resampled_to_the_right_length(tmp_path):
    """A 1.0-2.5 s segment of a 48 kHz stereo file comes back as 1.5 s of 16 kHz mono."""
    sf.write(tmp_path / "a.wav", np.random.default_rng(0).uniform(-0.5, 0.5, (48000 * 3, 2)), 48000)
    audio = read_audio(str(tmp_path / "a.wav"), 1.0, 2.5)
    assert audio.dtype == np.float32 and audio.shape == (24000,)


def test_opus_round_trip_keeps_length_and_content():
    """Opus coding keeps the sample count exactly and the waveform close (a 300 Hz tone)."""
    tone = (0.5 * np.sin(2 * np.pi * 300 * np.arange(32000) / 16000)).astype(np.float32)
    decoded, rate = decode_opus(encode_opus(tone))
    assert rate == 16000 and len(decoded) == len(tone)
    assert np.corrcoef(decoded[1000:-1000], tone[1000:-1000])[0, 1] > 0.95


def test_segment_past_the_end_is_refused(tmp_path):
    """A Kaldi segment that ends after the recording is an error with a reason, not silent padding."""
    sf.write(tmp_path / "a.wav", np.zeros(16000, np.float32), 16000)
    with pytest.raises(AudioError) as raised:
        read_audio(str(tmp_path / "a.wav"), 0.5, 3.0)
    assert raised.value.reason == "segment_out_of_range"
