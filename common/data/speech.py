"""Speech loader: metadata parquet + shards -> ``PaddedBatch`` es, rank-balanced and resumable.

The main process plans the epoch from metadata (``planning.plan_epoch``); each dataloader worker owns
whole shards, streams them front to back, keeps the Opus bytes of the utterances of its remaining
planned batches, decodes each when its batch is made, and yields ready collated batches
(``batch_size=None``: one pickled batch per step between processes, not one tensor per utterance).
Torch's DataLoader takes batches from its workers round-robin and every worker yields the same
number of batches, so the order inside a rank is fixed by the plan.
"""

import logging
import os
from collections import Counter

import numpy as np
import torch
from torch.utils.data import DataLoader

from common.data.config import SpeechLoaderConfig
from common.data.metadata import read_speech_metadata
from common.data.pipeline import Tokenizer, collate, count_tokens, crop_sample, crop_start, keep_mask, speech_sample
from common.data.planning import SlotPlan, batches_to_skip, plan_epoch
from common.data.shard_audio import BadDataCounts, choose_speeds, decode_member, speed_perturb, wanted_members
from common.data.stream import BatchStream, SlotDataset
from common.shard_format import is_unlabelled
from common.user_errors import UserValueError

logger = logging.getLogger(__name__)


class ShardStreamDataset(SlotDataset):
    """Yields one rank's planned batches for one epoch; inside a worker, only that worker's share.

    Set ``slots`` (the rank's ``SlotPlan`` list), ``speeds`` and ``consumed`` before iterating.
    """

    def __init__(self, metadata, tokenizer, features=None, prefix_ids=(), cache_audio=False, units=None,
                 max_sample_size=None, random_crop=True, seed=0):
        self.metadata = metadata
        self.max_sample_size, self.random_crop, self.seed = max_sample_size, random_crop, seed
        self.tokenizer = tokenizer
        self.units = units
        self.features = features
        self.prefix_ids = list(prefix_ids)
        self.cache = {} if cache_audio else None  # row -> decoded waveform, kept across epochs
        self.slots, self.speeds, self.consumed, self.epoch = [], None, 0, 0

    def slot_batches(self, worker):
        """Collated batches of one slot, from the first one not yet consumed."""
        slot = self.slots[worker]
        remaining = slot.batches[batches_to_skip(self.consumed, worker, len(self.slots)):]
        bad_data, last_good, owed = BadDataCounts(), None, 0
        waveforms = self.stream_waveforms(slot, remaining, bad_data)
        for rows in remaining:
            read = [row for row in rows if waveforms.has(row)]
            bad_data.update(missing=len(rows) - len(read))
            samples = [self.make_sample(row, waveform) for row in read
                       if (waveform := waveforms.get(row)) is not None]
            if not samples:  # keep the step count: repeat a real batch (no dummy), counted
                bad_data["repeated_batch"] += 1
                if last_good is None:
                    owed += 1
                    continue
                samples = last_good
            last_good = samples
            for _ in range(1 + owed):
                batch = collate(samples, self.features)
                batch.bad_data = dict(bad_data)
                batch.worker = worker
                yield batch
            owed = 0

    def stream_waveforms(self, slot, remaining, bad_data):
        """A ``WaveformStream`` over the slot's shards for the rows of the remaining batches."""
        wanted = set(np.concatenate(remaining).tolist()) if remaining else set()
        return WaveformStream(self.metadata, slot, wanted, bad_data, self.cache)

    def make_sample(self, row, waveform):
        """Per-sample steps: speed perturbation, cropping (with its units), tokenization (after the prefix
        tokens), sample dict."""
        text, key = self.metadata.texts[row], self.metadata.keys[row]
        waveform = speed_perturb(waveform, float(self.speeds[row]))
        units = None if self.units is None else self.units.units_by_key[key]
        if self.max_sample_size is not None:
            rng = np.random.default_rng([self.seed, self.epoch, int(row), 5]) if self.random_crop else None
            start = crop_start(len(waveform), self.max_sample_size, rng)
            waveform, units = crop_sample(waveform, units, self.max_sample_size, start,
                                          None if self.units is None else self.units.frame_rate_hz)
        tokens = None if self.tokenizer is None else self.prefix_ids + self.tokenizer.encode(text)
        sample = speech_sample(key, waveform, text, tokens)
        if units is not None:
            sample["units"] = torch.from_numpy(units.astype(np.int64))
        return sample


class WaveformStream:
    """Waveforms of wanted rows, read lazily in stream order as batches ask for them.

    The reader keeps each wanted member's Opus bytes (3.9 kB per second of audio in the demo's shards,
    ``local/check_shards.py``: a sixteenth of the decoded float32 waveform's 64 kB) and ``get``
    decodes it when its batch is made: the planned buffer of held utterances costs little memory
    (1024 LibriSpeech-like utterances: ~55 MB, not ~900 MB per worker), and each waveform goes from
    decoding to features while it is in cache.
    ``has(row)`` reads on until the reader is past ``row``; bytes are released by ``get``. With
    ``cache`` (a dict kept by the caller), every waveform handed over is kept and its row not read again.
    """

    def __init__(self, metadata, slot, wanted, bad_data, cache=None):
        self.metadata, self.bad_data = metadata, bad_data
        self.position_of = {int(row): i for i, row in enumerate(slot.stream_rows)}
        self.encoded, self.reached = {}, -1
        self.cache = cache
        wanted = wanted - cache.keys() if cache is not None else wanted
        self.reader = self.read(slot, wanted)

    def read(self, slot, wanted):
        """Yield the stream position reached after each kept member and at each shard end."""
        shard_of_stream = self.metadata.shard_of_row[slot.stream_rows]
        end = 0
        for shard in slot.shards:
            rows = slot.stream_rows[shard_of_stream == shard]
            end += len(rows)
            wanted_keys = {self.metadata.keys[r]: int(r) for r in rows if int(r) in wanted}
            if wanted_keys:
                for key, data in wanted_members(self.metadata.shard_paths[shard], wanted_keys, self.bad_data):
                    row = wanted_keys[key]
                    self.encoded[row] = data
                    yield self.position_of[row]
            yield end - 1

    def has(self, row):
        """Whether ``row``'s member was read (reads on until the stream is past it)."""
        if self.cache is not None and row in self.cache:
            return True
        while self.reached < self.position_of[row] and row not in self.encoded:
            self.reached = max(self.reached, next(self.reader, len(self.position_of)))
        return row in self.encoded

    def get(self, row):
        """Decode and hand over the waveform of a read ``row`` (releasing its bytes); None when it
        cannot be decoded (counted as ``undecodable``)."""
        if row not in self.encoded:
            return self.cache[row]
        shard_path = self.metadata.shard_paths[self.metadata.shard_of_row[row]]
        waveform = decode_member(self.metadata.keys[row], self.encoded.pop(row), shard_path, self.bad_data,
                                 self.metadata.durations[row])
        if self.cache is not None and waveform is not None:
            self.cache[row] = waveform
        return waveform


class SpeechLoader(BatchStream):
    """Batches of speech for one rank; see ``make_speech_loader``. ``name`` labels its log lines."""

    name = "speech"

    def __init__(self, metadata, dataset, config, seed, rank, world_size, share="shards"):
        super().__init__()
        self.metadata, self.dataset, self.config = metadata, dataset, config
        self.seed, self.rank, self.world_size, self.share = seed, rank, world_size, share
        self._plans = {}
        self.bad_data = Counter()

    def used_rows(self):
        """Metadata rows this loader trains on (its filters passed), in metadata order."""
        return np.flatnonzero(self.metadata.shard_of_row >= 0)

    def used_keys(self):
        """Sample keys this loader trains on (its filters passed), in metadata order."""
        return self.metadata.keys[self.used_rows()].tolist()

    def used_utterances(self):
        """``(durations in s, transcripts)`` of the utterances this loader trains on, in metadata order."""
        used = self.used_rows()
        return self.metadata.durations[used], list(self.metadata.texts[used])

    def plan(self, epoch):
        """(rank plan, speed per row) of ``epoch``, cached for the current epoch only."""
        if epoch not in self._plans:
            rng, config = np.random.default_rng([self.seed, epoch, 1]), self.config
            speeds = choose_speeds(len(self.metadata), config.speed_perturb, rng)
            planned_ranks = self.world_size if self.share == "shards" else 1
            durations = np.minimum(self.metadata.durations / speeds, config.max_sample_seconds)  # after cropping
            plan = plan_epoch(durations, self.metadata.shard_of_row, self.seed, epoch,
                              planned_ranks, config.num_workers, budget=config.max_batch_seconds,
                              max_batch_size=config.max_batch_size, buffer_size=config.batch_buffer,
                              emit_fraction=config.emit_fraction)
            self._plans = {epoch: (self.rank_share(plan), speeds)}
        return self._plans[epoch]

    def planned_durations(self, epoch):
        """Seconds of each metadata row as ``epoch`` reads it (its duration over the epoch's speed): what the
        plan batches under ``max_batch_seconds``, and what the data report counts."""
        return self.metadata.durations / self.plan(epoch)[1]

    def rank_share(self, plan):
        """This rank's slots: its own shards' (``share="shards"``), or every ``world_size``-th batch of
        the one-rank plan (``share="batches"``: evaluation, where a single shard still splits)."""
        if self.share == "shards":
            return plan[self.rank]
        return [SlotPlan(slot.shards, slot.stream_rows, slot.batches[self.rank::self.world_size]) for slot in plan[0]]

    def batches_in_epoch(self, epoch):
        slots, _ = self.plan(epoch)
        return sum(len(slot.batches) for slot in slots)

    def planned_keys(self, epoch):
        """Sample keys of each batch of ``epoch`` in yield order (no audio read)."""
        slots, _ = self.plan(epoch)
        return [list(self.metadata.keys[b]) for j in range(len(slots[0].batches)) for b in
                (slot.batches[j] for slot in slots)]

    def epoch_batches(self, epoch, start):
        slots, speeds = self.plan(epoch)
        self.dataset.slots, self.dataset.speeds, self.dataset.consumed = slots, speeds, start
        self.dataset.epoch = epoch
        workers = len(slots) if self.config.num_workers > 0 else 0
        loader = DataLoader(self.dataset, batch_size=None, num_workers=workers,
                            prefetch_factor=2 if workers else None)
        last_counts = {}
        for batch in loader:
            last_counts[batch.worker] = batch.bad_data
            yield batch
        self.bad_data = sum((Counter(c) for c in last_counts.values()), Counter())

    def end_epoch(self, epoch):
        durations = self.planned_durations(epoch)
        audio = sum(durations[b].sum() for slot in self.plan(epoch)[0] for b in slot.batches)
        logger.info("%s loader, epoch %d rank %d: %d batches, %.1f s audio, skipped data %s", self.name, epoch,
                    self.rank, self.batches_in_epoch(epoch), audio, dict(self.bad_data) or "none")


def make_speech_loader(parquets, tokenizer, config, seed=0, rank=0, world_size=1, fbank=None, text_field="text",
                       prefix_tokens=None, share="shards", require_text=True, units=None):
    """Build the speech loader of one rank.

    Arguments
    ---------
    parquets : str, Path or list
        ``metadata_pool.parquet`` / ``metadata_core.parquet`` files; shards sit beside each file.
    tokenizer : str or Tokenizer
        SentencePiece model path (ids per the tokenizer contract).
    config : SpeechLoaderConfig or dict
        How it batches: the recipe's ``train_loader`` / ``eval_loader`` block (``common.data.config``).
    seed, rank, world_size : int
        Same seed + shards + world size + workers give the same batches in the same order.
    fbank : callable, optional
        The model's feature extractor (e.g. ``speechbrain.lobes.features.Fbank``), run on each waveform
        in the workers when ``config.fbank_in_loader``: batches then hold ``feats`` instead of ``sig``.
    text_field : str
        The target text: a parquet column (``text``) or a key of the ``extra`` JSON column, e.g.
        ``translation`` for speech translation. Samples without it are left out (with a warning).
    prefix_tokens : list of str or int, optional
        Tokens put before every target, e.g. ``["<fr>"]`` (a target-language tag, a user symbol of
        the tokenizer) or ids; ``tokens_bos`` becomes ``[1, tag, ...]``. Batch ``text`` stays plain.
    share : str
        How ranks divide the data: ``"shards"`` (training: whole shards per rank, the same number of
        batches on every rank) or ``"batches"`` (evaluation: the batches of the one-rank plan dealt
        round-robin, every utterance exactly once, ranks differing by at most one batch).
    require_text : bool
        True (finetuning): samples without the text are left out, and untranscribed shards
        (``make_shards.py --unlabelled``) are refused with a ValueError naming the folder. False
        (pretraining, which does not read the text): every sample is used; batches carry no tokens.
    units : common.data.units.UnitTable, optional
        Discrete units per sample (``local/extract_units.py``): batches carry them as ``units`` (padded;
        ``batch.units.lengths`` relative). Every sample the loader uses must have them (checked here).

    Returns
    -------
    SpeechLoader
        Iterate once per epoch; ``len()``, ``set_epoch()``, ``state_dict()``/``load_state_dict()``,
        SpeechBrain checkpoint hooks. Batches: ``id``, ``sig`` (or ``feats``), ``duration`` (s),
        ``text``, ``tokens``, ``tokens_bos``, ``tokens_eos``.

    Example
    -------
    >>> loader = make_speech_loader("shards/metadata_pool.parquet", "tok/unigram_500.model",
    ...                             SpeechLoaderConfig(max_batch_seconds=200.0, num_workers=2))  # doctest: +SKIP
    """
    config = SpeechLoaderConfig.from_config(config)
    if config.fbank_in_loader and fbank is None:
        raise UserValueError("fbank_in_loader: True needs the model's feature extractor: pass fbank=...")
    tokenizer = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer(tokenizer)
    if require_text:
        refuse_unlabelled(parquets)
    metadata = read_speech_metadata(parquets, text_field)
    prefix_ids = [tokenizer.piece_id(t) if isinstance(t, str) else int(t) for t in prefix_tokens or []]
    keep = texts_present(metadata.texts, text_field) if require_text else np.ones(len(metadata), dtype=bool)
    if config.filters:
        texts = np.array([text or "" for text in metadata.texts], dtype=object)
        keep &= keep_mask(metadata.durations, count_tokens(tokenizer, texts) + len(prefix_ids), config.filters,
                          fastest_speed=config.fastest_speed)
    metadata.shard_of_row = np.where(keep, metadata.shard_of_row, -1)
    used = np.minimum(metadata.durations[metadata.shard_of_row >= 0] / config.slowest_speed, config.max_sample_seconds)
    if len(used) and used.max() > config.max_batch_seconds:
        raise UserValueError(
            f"max_batch_seconds={config.max_batch_seconds} is smaller than the longest utterance allowed "
            f"({used.max():.2f} s after speed perturbation and cropping): raise it or lower max_duration "
            "(or max_sample_size)"
        )
    features = fbank if config.fbank_in_loader else None
    if units is not None:
        units.check_covers(metadata.keys[metadata.shard_of_row >= 0].tolist(), parquets)
    dataset = ShardStreamDataset(metadata, tokenizer if require_text else None, features, prefix_ids,
                                 config.cache_audio, units, config.max_sample_size, config.random_crop, seed)
    if share not in ("shards", "batches"):
        raise ValueError(f"share={share!r}: use 'shards' (training) or 'batches' (evaluation)")
    return SpeechLoader(metadata, dataset, config, seed, rank, world_size, share)


def refuse_unlabelled(parquets):
    """ValueError naming the first untranscribed shard folder among ``parquets``."""
    for path in [parquets] if isinstance(parquets, (str, os.PathLike)) else parquets:
        if is_unlabelled(path):
            raise UserValueError(
                f"{os.path.dirname(os.path.abspath(path))} holds untranscribed speech (made with "
                "local/make_shards.py --unlabelled): a model trained on transcripts cannot use it. Give it to "
                "recipes/pretrain (--train), or shard the corpus again without --unlabelled, with its transcripts")


def texts_present(texts, text_field):
    """True where a sample has a ``text_field`` text; logs how many lack it."""
    present = np.array([text is not None for text in texts], dtype=bool)
    if not present.all():
        logger.warning("%d of %d samples have no %r text and are left out", int((~present).sum()),
                       len(present), text_field)
    return present
