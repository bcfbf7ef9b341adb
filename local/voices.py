"""Text-to-speech voices of three Debian synthesizers, one interface: ``synthesize(voice, text, ...)``.

A voice is named ``engine:name``:

- ``espeak:en-us+m3``: espeak-ng, an accent (en-us, en-gb-x-rp, en-gb-scotland, ...) and a variant;
- ``flite:awb``: a flite voice (kal, kal16, awb, rms, slt);
- ``festival:ked_diphone``: a festival voice (kal_diphone, ked_diphone, cmu_us_slt_arctic_hts).

Speed and pitch work for every engine: espeak-ng takes them natively; for flite and festival the
speech is synthesized slower by the pitch factor and resampled, which raises pitch and tempo
together (a tape played faster).

>>> audio, rate = synthesize("espeak:en-us+m3", "hello world", speed=1.1, pitch=0.95)  # doctest: +SKIP
"""

import io
import math
import os
import shutil
import subprocess
import tempfile

import numpy as np
import scipy.signal
import soundfile as sf

# Debian packages that provide each engine and its voices (installed by `make setup`).
ENGINE_PACKAGES = {
    "espeak": ["espeak-ng"],
    "flite": ["flite"],
    "festival": ["festival", "festvox-kallpc16k", "festvox-kdlpc16k", "festvox-us-slt-hts"],
}
ENGINE_PROGRAMS = {"espeak": "espeak-ng", "flite": "flite", "festival": "text2wave"}
# The person recorded for each flite and festival voice, and their gender: two engines can speak with
# the same recording (kal's diphones, the CMU ARCTIC slt speaker), so a voice is new only if its
# speaker is.
RECORDED_SPEAKERS = {
    "flite:kal": ("kal", "male"), "flite:kal16": ("kal", "male"), "festival:kal_diphone": ("kal", "male"),
    "festival:ked_diphone": ("ked", "male"), "flite:awb": ("awb", "male"), "flite:rms": ("rms", "male"),
    "flite:slt": ("slt", "female"), "festival:cmu_us_slt_arctic_hts": ("slt", "female"),
}
# espeak-ng variants that switch to its Klatt synthesizer (a "klatt" line in espeak-ng-data/voices/!v/)
# rather than its default formant synthesis: another voice type of the same engine.
ESPEAK_KLATT_VARIANTS = {"klatt", "klatt2", "klatt3", "klatt4", "klatt5", "klatt6", "edward", "edward2",
                         "adam", "benjamin", "caleb", "david", "announcer", "UniRobot", "robosoft",
                         "robosoft2", "robosoft3"}
ESPEAK_BASE_WPM = 165  # espeak-ng's words per minute at speed 1.0
ESPEAK_BASE_PITCH = 50  # espeak-ng's pitch (0-99) at pitch 1.0
TIMEOUT_S = 120


class SynthesisError(RuntimeError):
    """A synthesizer that failed or produced no audio; the message names the voice and text."""


def engine_of(voice):
    """'espeak' of 'espeak:en-us+m3'; raises ValueError for an unknown engine."""
    engine, _, name = voice.partition(":")
    if engine not in ENGINE_PROGRAMS or not name:
        raise ValueError(f"voice {voice!r}: expected engine:name with engine one of "
                         f"{sorted(ENGINE_PROGRAMS)}, e.g. espeak:en-us+m3 or flite:awb")
    return engine


def voice_type(voice):
    """What kind of voice it is: 'espeak-formant', 'espeak-klatt', or the engine and recorded speaker
    ('flite:awb', 'festival:kal': one type per recorded person and engine)."""
    engine, name = engine_of(voice), voice.split(":", 1)[1]
    if engine == "espeak":
        return "espeak-klatt" if name.partition("+")[2] in ESPEAK_KLATT_VARIANTS else "espeak-formant"
    return f"{engine}:{RECORDED_SPEAKERS.get(voice, (name,))[0]}"


def check_engines(voices):
    """Raises SystemExit naming the Debian packages to install when a voice's program is missing."""
    engines = sorted({engine_of(voice) for voice in voices})
    missing = [e for e in engines if shutil.which(ENGINE_PROGRAMS[e]) is None]
    if missing:
        packages = " ".join(p for e in missing for p in ENGINE_PACKAGES[e])
        raise SystemExit(f"error: no {', '.join(ENGINE_PROGRAMS[e] for e in missing)} on this machine: "
                         f"run `make setup` or `apt-get install {packages}`")


def synthesize(voice, text, speed=1.0, pitch=1.0):
    """Speak ``text`` with ``voice``; returns (float32 mono samples, sample rate).

    ``speed`` > 1 speaks faster, ``pitch`` > 1 speaks higher (both factors around 1.0).
    """
    engine, name = engine_of(voice), voice.split(":", 1)[1]
    if engine == "espeak":
        return _espeak(name, text, speed, pitch)
    stretch = pitch / speed  # synthesize slower by the pitch factor, resample back faster below
    audio, rate = _flite(name, text, stretch) if engine == "flite" else _festival(name, text, stretch)
    return _raise_pitch(audio, pitch), rate


def _espeak(name, text, speed, pitch):
    command = ["espeak-ng", "-v", name, "-s", str(round(ESPEAK_BASE_WPM * speed)),
               "-p", str(int(np.clip(round(ESPEAK_BASE_PITCH * pitch), 0, 99))), "--stdout", text]
    return _read_wav_bytes(_run(command, name).stdout, f"espeak:{name}")


def _flite(name, text, stretch):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "out.wav")
        _run(["flite", "-voice", name, "--setf", f"duration_stretch={stretch:.4f}", "-t", text,
              "-o", path], f"flite:{name}")
        return _read_wav_file(path, f"flite:{name}")


def _festival(name, text, stretch):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "out.wav")
        _run(["text2wave", "-eval", f"(voice_{name})",
              "-eval", f"(Parameter.set 'Duration_Stretch {stretch:.4f})", "-o", path],
             f"festival:{name}", stdin=text)
        return _read_wav_file(path, f"festival:{name}")


def _run(command, voice, stdin=None):
    try:
        result = subprocess.run(command, input=stdin.encode() if stdin else None, capture_output=True,
                                timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        raise SynthesisError(f"{voice}: {command[0]} took over {TIMEOUT_S} s") from error
    if result.returncode != 0:
        raise SynthesisError(f"{voice}: {command[0]} failed ({result.stderr.decode(errors='replace')[-300:]})")
    return result


def _read_wav_bytes(data, voice):
    samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return _mono_or_fail(samples, rate, voice)


def _read_wav_file(path, voice):
    if not os.path.isfile(path):
        raise SynthesisError(f"{voice}: the synthesizer wrote no audio")
    samples, rate = sf.read(path, dtype="float32", always_2d=True)
    return _mono_or_fail(samples, rate, voice)


def _mono_or_fail(samples, rate, voice):
    if len(samples) == 0 or not np.any(samples):
        raise SynthesisError(f"{voice}: the synthesizer produced silence")
    return samples.mean(axis=1), rate


def _raise_pitch(audio, factor):
    """Play ``audio`` ``factor`` times faster at the same sample rate (pitch and tempo up)."""
    if abs(factor - 1.0) < 1e-3:
        return audio
    up, down = _ratio(1.0 / factor)
    return scipy.signal.resample_poly(audio, up, down).astype(np.float32)


def _ratio(value, denominator=1000):
    """``value`` as a reduced fraction with a bounded denominator (for resample_poly)."""
    numerator = max(1, round(value * denominator))
    common = math.gcd(numerator, denominator)
    return numerator // common, denominator // common
