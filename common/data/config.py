"""Loaders described in the config: the ``train_loader:`` / ``eval_loader:`` blocks of a recipe's yaml,
checked into typed dataclasses and handed straight to ``make_speech_loader`` / ``make_text_loader``.

    train_loader:                       # common.data.SpeechLoaderConfig
        max_batch_seconds: !ref <max_batch_seconds>
        num_workers: 4
        filters: {max_duration: 30.0}

    config = SpeechLoaderConfig.from_config(hparams["train_loader"], "train_loader")
    loader = make_speech_loader(parquet, tokenizer, config, seed=hparams["seed"], fbank=...)

Each quantity keeps one name from the yaml to the batcher. A misspelled key names the closest one;
a value of the wrong type names the key, the value and the type expected.
"""

import dataclasses
import difflib
import typing
from typing import Optional

from common.audio_io import SAMPLE_RATE
from common.user_errors import UserValueError


class LoaderConfigError(UserValueError):
    """A loader block with an unknown key or a value of the wrong type; the message says the fix."""


@dataclasses.dataclass
class SpeechLoaderConfig:
    """How a speech loader reads and batches (see ``make_speech_loader``).

    max_batch_seconds : padded audio per batch (batch size x longest utterance after speed
        perturbation), never exceeded.
    max_batch_size : most utterances per batch (None: no limit).
    num_workers : dataloader workers per rank, each owning whole shards (0: the main process).
    batch_buffer : utterances each worker holds to batch by length (as Opus bytes, ~50 kB each).
    emit_fraction : share of a full buffer emitted per round (tightness, ``buffered_batches``).
    filters : ``min_duration`` / ``max_duration`` (s), ``min_tokens`` / ``max_tokens``,
        ``max_tokens_per_second``; applied to the metadata before planning.
    speed_perturb : speed factors drawn per utterance and epoch, e.g. [0.9, 1.0, 1.1].
    cache_audio : keep decoded audio in memory after its first epoch (small corpora, 0 workers).
    fbank_in_loader : compute Fbank features in the workers (the model then takes features).
    max_sample_size : longest waveform handed over, in 16 kHz samples (fairseq's ``max_sample_size``,
        e.g. 250000 = 15.6 s): a longer one is cropped to it (its units too), not dropped; None: no crop.
        The ``max_duration`` filter still drops what it names: raise it to keep long utterances.
    random_crop : crop at a random start (drawn from seed, epoch and utterance); False: keep the start.
    """

    max_batch_seconds: float
    max_batch_size: Optional[int] = None
    num_workers: int = 0
    batch_buffer: int = 1024
    emit_fraction: float = 0.25
    filters: Optional[dict] = None
    speed_perturb: Optional[list] = None
    cache_audio: bool = False
    fbank_in_loader: bool = False
    max_sample_size: Optional[int] = None
    random_crop: bool = True

    @classmethod
    def from_config(cls, block, name="loader"):
        """The dataclass of a yaml mapping, checked (see the module docstring)."""
        return _checked(cls, block, name)

    @property
    def max_sample_seconds(self):
        """The longest audio a batch holds after cropping, in seconds (inf without ``max_sample_size``)."""
        return float("inf") if self.max_sample_size is None else self.max_sample_size / SAMPLE_RATE

    @property
    def fastest_speed(self):
        """The largest speed factor (1.0 without speed perturbation): the shortest an utterance gets."""
        return max(self.speed_perturb or [1.0])

    @property
    def slowest_speed(self):
        """The smallest speed factor (1.0 without speed perturbation): the longest an utterance gets."""
        return min(self.speed_perturb or [1.0])

    def __post_init__(self):
        if self.max_sample_size is not None and self.max_sample_size < 1:
            raise LoaderConfigError(f"max_sample_size={self.max_sample_size}: give samples at 16 kHz (e.g. "
                                    "250000 = 15.6 s) or null for no cropping")
        if self.cache_audio and self.num_workers > 0:
            raise LoaderConfigError(
                f"cache_audio: True keeps audio in the main process but num_workers is {self.num_workers}: "
                "set num_workers: 0 (or cache_audio: False)")


@dataclasses.dataclass
class TextLoaderConfig:
    """How a text loader batches (see ``make_text_loader``).

    max_batch_tokens : padded tokens per batch (batch size x longest source + target).
    max_batch_size : most sentences per batch (None: no limit).
    batch_buffer : sentences held to batch by length.
    max_tokens : drop sentences (pairs) longer than this, source + target (None: keep all).
    num_workers : dataloader workers per rank, each reading and tokenizing whole text shards (0: the
        main process).
    """

    max_batch_tokens: int
    max_batch_size: Optional[int] = None
    batch_buffer: int = 1024
    max_tokens: Optional[int] = None
    num_workers: int = 0

    @classmethod
    def from_config(cls, block, name="loader"):
        """The dataclass of a yaml mapping, checked (see the module docstring)."""
        return _checked(cls, block, name)


def _checked(cls, block, name):
    if isinstance(block, cls):
        return block
    if not isinstance(block, dict):
        raise LoaderConfigError(f"{name} must be a mapping of {cls.__name__} fields, not {block!r}")
    fields = {field.name: field for field in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key, value in block.items():
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f' Did you mean "{close[0]}"?' if close else f" Known keys: {', '.join(fields)}"
            raise LoaderConfigError(f'{name}: "{key}" is not a loader setting.{hint}')
        _check_type(f"{name}[{key}]", value, hints[key])
    missing = [key for key, field in fields.items() if field.default is dataclasses.MISSING and key not in block]
    if missing:
        raise LoaderConfigError(f"{name}: {', '.join(missing)} must be set")
    return cls(**block)


def _check_type(key, value, hint):
    """Accepts ``value`` for ``hint`` (int for float, None for Optional); raises otherwise."""
    allowed = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) is typing.Union \
        else [hint]
    if value is None and typing.get_origin(hint) is typing.Union:
        return
    for kind in allowed:
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return
        if kind in (bool, list, dict) and isinstance(value, kind):
            return
    nullable = " or null" if typing.get_origin(hint) is typing.Union else ""
    expected = " or ".join(k.__name__ for k in allowed) + nullable
    raise LoaderConfigError(f"{key}={value!r} is a {type(value).__name__}: expected {expected}")
