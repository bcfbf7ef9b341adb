"""Tandem's streaming data layer: metadata parquet + shards -> SpeechBrain ``PaddedBatch`` es.

Public API (everything a recipe needs)::

    from common.data import SpeechLoaderConfig, make_speech_loader, make_text_loader, MixedLoader

    config = SpeechLoaderConfig(max_batch_seconds=200.0, num_workers=2,
                                filters={"max_duration": 35.0, "max_tokens_per_second": 30})
    speech = make_speech_loader("shards/metadata_pool.parquet", "tokenizer/unigram_500.model", config,
                                seed=1234, rank=rank, world_size=world_size)
    checkpointer.add_recoverable("train_loader", speech)
    for epoch in epoch_counter:
        speech.set_epoch(epoch)
        for batch in speech:   # len(speech) batches, the same on every rank
            ...

Modules: ``audio`` (tar stream, opus decode, speed), ``metadata`` (parquet), ``batching`` (padded-budget
batches), ``planning`` (rank/worker plans), ``pipeline`` (per-sample steps), ``speech`` / ``text``
(loaders), ``mixing`` (corpora and modalities), ``stream`` (epoch + resume state).
"""

from common.data.batching import buffered_batches, sorted_oracle_batches
from common.data.config import LoaderConfigError, SpeechLoaderConfig, TextLoaderConfig
from common.data.mixing import MixedLoader, mixing_probabilities
from common.data.pipeline import Tokenizer, speech_input, vocab_size
from common.data.speech import SpeechLoader, make_speech_loader
from common.data.stream import BatchStream
from common.data.text import TextLoader, make_text_loader

__all__ = [
    "BatchStream",
    "LoaderConfigError",
    "MixedLoader",
    "SpeechLoader",
    "SpeechLoaderConfig",
    "TextLoader",
    "TextLoaderConfig",
    "Tokenizer",
    "buffered_batches",
    "make_speech_loader",
    "make_text_loader",
    "mixing_probabilities",
    "sorted_oracle_batches",
    "speech_input",
    "vocab_size",
]
