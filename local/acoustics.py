"""Recording conditions for synthesized speech: room, noise, silence, level, channels, rate, format.

Each function takes float32 samples and a numpy ``Generator`` where it draws, so a seeded plan
reproduces every file exactly.

>>> rng = np.random.default_rng(0)
>>> speech = np.sin(np.arange(16000) / 16000 * 2 * np.pi * 200).astype(np.float32)
>>> noisy = add_noise(speech, 16000, snr_db=10.0, kind="pink", rng=rng)
>>> round(snr_db(speech, noisy - speech))
10
"""

import math

import numpy as np
import scipy.signal
import soundfile as sf

NOISE_KINDS = ("white", "pink", "brown", "hum", "babble")
# soundfile (libsndfile) format and subtype per file extension; mp3 takes the MPEG rates only
FILE_FORMATS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"),
                "ogg": ("OGG", "VORBIS")}
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)


def snr_db(signal, noise):
    """Signal-to-noise ratio of two arrays in dB."""
    return 10 * math.log10(float(np.mean(signal**2)) / max(float(np.mean(noise**2)), 1e-20))


def resample(audio, rate, target_rate):
    """Polyphase resampling of mono float32 ``audio`` from ``rate`` to ``target_rate``."""
    if rate == target_rate:
        return audio
    common = math.gcd(int(rate), int(target_rate))
    return scipy.signal.resample_poly(audio, target_rate // common, rate // common).astype(np.float32)


def trim_silence(audio, rate, threshold=1e-3, margin_s=0.05):
    """Cut the synthesizer's own leading and trailing silence down to ``margin_s`` seconds."""
    loud = np.flatnonzero(np.abs(audio) > threshold)
    if len(loud) == 0:
        return audio
    margin = int(margin_s * rate)
    return audio[max(0, loud[0] - margin):loud[-1] + margin]


def room_impulse_response(rate, rt60_s, direct_to_reverb_db, rng):
    """A synthetic room: a direct impulse plus exponentially decaying noise reaching -60 dB at
    ``rt60_s``; ``direct_to_reverb_db`` sets the energy of the direct path against the tail."""
    length = int(rt60_s * rate)
    t = np.arange(length) / rate
    tail = rng.standard_normal(length) * np.exp(-6.9078 * t / rt60_s)  # ln(1000) = 60 dB of decay
    tail[: int(0.002 * rate)] = 0.0  # the first reflection arrives a little after the direct path
    tail *= math.sqrt(10 ** (-direct_to_reverb_db / 10) / max(float(np.sum(tail**2)), 1e-12))
    tail[0] = 1.0
    return tail.astype(np.float32)


def add_reverb(audio, rate, rt60_s, direct_to_reverb_db, rng):
    """``audio`` convolved with a synthetic room (same length plus the room's tail), its RMS kept."""
    wet = scipy.signal.fftconvolve(audio, room_impulse_response(rate, rt60_s, direct_to_reverb_db, rng))
    wet *= math.sqrt(float(np.mean(audio**2)) / max(float(np.mean(wet**2)), 1e-20))
    return wet.astype(np.float32)


def make_noise(length, rate, kind, rng):
    """``length`` samples of unit-RMS noise: white, pink (1/f), brown (1/f²), mains hum with
    harmonics over a little white noise, or babble-like (speech-band noise modulated at syllable
    rate)."""
    if kind == "white":
        noise = rng.standard_normal(length)
    elif kind in ("pink", "brown"):
        spectrum = np.fft.rfft(rng.standard_normal(length))
        freqs = np.fft.rfftfreq(length, 1 / rate)
        freqs[0] = freqs[1] if length > 1 else 1.0
        spectrum /= np.sqrt(freqs) if kind == "pink" else freqs
        noise = np.fft.irfft(spectrum, n=length)
    elif kind == "hum":
        t = np.arange(length) / rate
        mains = rng.choice([50.0, 60.0])
        noise = sum(np.sin(2 * np.pi * mains * h * t + rng.uniform(0, 2 * np.pi)) / h for h in (1, 2, 3, 5))
        noise = noise + 0.3 * rng.standard_normal(length)
    elif kind == "babble":
        band = scipy.signal.butter(4, [300, min(3400, 0.45 * rate)], btype="band", fs=rate, output="sos")
        carrier = scipy.signal.sosfilt(band, rng.standard_normal(length))
        t = np.arange(length) / rate
        envelope = sum(1 + np.sin(2 * np.pi * rng.uniform(2, 6) * t + rng.uniform(0, 6.3)) for _ in range(4))
        noise = carrier * envelope
    else:
        raise ValueError(f"noise kind {kind!r}: use one of {NOISE_KINDS}")
    return (noise / max(float(np.sqrt(np.mean(noise**2))), 1e-12)).astype(np.float32)


def add_noise(audio, rate, snr_db, kind, rng):
    """``audio`` plus ``kind`` noise at ``snr_db`` dB below the speech's RMS."""
    power = max(float(np.mean(audio**2)), 1e-12)
    noise = make_noise(len(audio), rate, kind, rng) * math.sqrt(power / 10 ** (snr_db / 10))
    return (audio + noise).astype(np.float32)


def pad_silence(audio, rate, lead_s, trail_s, rng, floor_db=-70.0):
    """Leading and trailing silence (a faint noise floor, as a real recording has)."""
    lead, trail = np.zeros(int(lead_s * rate), np.float32), np.zeros(int(trail_s * rate), np.float32)
    padded = np.concatenate([lead, audio, trail])
    return (padded + rng.standard_normal(len(padded)).astype(np.float32) * 10 ** (floor_db / 20))


def set_level(audio, rms_dbfs, peak_limit=0.99):
    """Scale ``audio`` to ``rms_dbfs`` (dB relative to full scale), lowered if it would clip."""
    rms = max(float(np.sqrt(np.mean(audio**2))), 1e-12)
    gain = 10 ** (rms_dbfs / 20) / rms
    peak = float(np.max(np.abs(audio))) * gain
    if peak > peak_limit:
        gain *= peak_limit / peak
    return (audio * gain).astype(np.float32)


def to_stereo(audio, rate, rng):
    """Two channels as two microphones hear them: the second delayed up to 1 ms and at another gain."""
    delay = int(rng.uniform(0, 0.001) * rate)
    second = np.concatenate([np.zeros(delay, np.float32), audio[: len(audio) - delay]]) * rng.uniform(0.6, 1.0)
    return np.stack([audio, second], axis=1).astype(np.float32)


def write_audio(path, samples, rate, extension):
    """Write ``samples`` ([frames] or [frames, channels]) as ``extension`` (wav, flac, mp3, ogg)."""
    if extension not in FILE_FORMATS:
        raise ValueError(f"audio format {extension!r}: use one of {sorted(FILE_FORMATS)}")
    if extension == "mp3" and rate not in MP3_RATES:
        raise ValueError(f"mp3 cannot hold {rate} Hz audio: use one of {MP3_RATES}")
    file_format, subtype = FILE_FORMATS[extension]
    sf.write(path, np.clip(samples, -1.0, 1.0), rate, format=file_format, subtype=subtype)
