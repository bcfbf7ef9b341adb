"""Self-training's pseudo-labels: a finetuned model (with its language model) transcribes untranscribed
speech, the hypotheses it is confident of become transcripts, and finetuning goes on with them beside
the labelled speech (Kahn et al., 2020; Xu et al., 2021: self-training adds to pretraining).

    trained = load_trained("exp/finetune_small", lm_dir="exp/finetune_small_lm", lm_weight=1.0)
    dev = decode_scored(trained, parquet_audio(["data/shards/valid/metadata_pool.parquet"]))
    threshold = choose_threshold(dev, parquet_texts(["data/shards/valid/metadata_pool.parquet"]))
    guard = HeldOut.of(["data/shards/valid/...parquet", "data/shards/test/...parquet"])
    pool = decode_scored(trained, parquet_audio([pool_parquet]), guard=guard)
    kept = keep_confident(pool, threshold.score)
    write_pseudo_parquet([pool_parquet], kept, "exp/st1/pseudo_labels/metadata_pool.parquet")

**Confidence** is the beam search's score of the chosen hypothesis: the joint CTC / attention
log-probability (+ the language model's, at its weight) per token when the config normalises length
(``length_normalization: True``, every shipped config), so short and long utterances compare.

**The threshold is chosen on dev** (``choose_threshold``): dev is decoded the same way and its
hypotheses ranked by score; the threshold is the score of the lowest-ranked hypothesis of the largest
top-ranked share of dev whose WER is at most ``target_wer``, by default half the WER of all of dev
(``wer_ratio`` 0.5): the pseudo-labels kept are expected to hold half the errors the model makes on
average. The share is at least ``min_share`` of dev (10 %) so the estimate rests on more than a handful
of utterances; when no such share meets the target, nothing is kept (a model that is not yet confident
where it is right would teach its own errors).

**Held-out speech never becomes a pseudo-label** (``HeldOut``): a pool utterance whose key, or whose
decoded audio (16-bit PCM, SHA-256), is that of a dev or test utterance is dropped before decoding,
whatever its name, and counted.
"""

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field

import numpy as np
import pyarrow.parquet as pq
import torch
from speechbrain.utils.edit_distance import wer_details_for_batch

from common.atomic import atomic_path, atomic_write_text
from common.audio_io import SAMPLE_RATE
from common.data.metadata import read_table
from common.data.shard_audio import BadDataCounts, decoded_audio
from common.decoding import ids_to_text
from common.inference import length_batches, pad_waveforms
from common.models.experiment import AVERAGED_FILE
from common.shard_format import POOL_PARQUET, write_metadata
from common.user_errors import UserValueError

logger = logging.getLogger(__name__)

DEFAULT_WER_RATIO = 0.5  # kept dev hypotheses must hold at most half the errors of all of dev
DEFAULT_MIN_SHARE = 0.1  # the threshold rests on at least a tenth of dev


def pool_parquet(path):
    """A shard folder's ``metadata_pool.parquet``, or ``path`` itself when it names a parquet."""
    return os.path.join(path, POOL_PARQUET) if os.path.isdir(path) else path


def audio_fingerprint(waveform):
    """SHA-256 of a waveform as 16-bit PCM: the same recording under another name has the same one."""
    samples = np.asarray(waveform, dtype=np.float32)
    pcm = np.clip(np.round(samples * 32767.0), -32768, 32767).astype("<i2")
    return hashlib.sha256(pcm.tobytes()).hexdigest()


def parquet_audio(parquets, max_seconds=None):
    """Yield ``(key, waveform)`` (float32 16 kHz) of every row of the shard parquets, shard by shard;
    rows longer than ``max_seconds`` are skipped (counted in the log)."""
    table = read_table([pool_parquet(p) for p in parquets], ["sample_key", "duration", "shard_name"])
    keys, durations = table["sample_key"].to_pylist(), table["duration"].to_pylist()
    shards = table["shard_path"].to_pylist()
    too_long = [k for k, d in zip(keys, durations) if max_seconds is not None and d > max_seconds]
    if too_long:
        logger.info("%d utterance(s) longer than %.1f s left out (first: %s)", len(too_long), max_seconds,
                    too_long[0])
    wanted_by_shard = {}
    for key, duration, shard in zip(keys, durations, shards):
        if max_seconds is None or duration <= max_seconds:
            wanted_by_shard.setdefault(shard, set()).add(key)
    bad = BadDataCounts()
    for shard in sorted(wanted_by_shard):
        for key, waveform in decoded_audio(shard, wanted_by_shard[shard], bad):
            yield key, waveform.numpy()


def parquet_texts(parquets):
    """``{key: transcript}`` of the shard parquets' rows that have one."""
    table = read_table([pool_parquet(p) for p in parquets], ["sample_key", "text", "shard_name"])
    return {k: t for k, t in zip(table["sample_key"].to_pylist(), table["text"].to_pylist()) if t}


@dataclass
class HeldOut:
    """Keys and audio fingerprints of the dev and test utterances: what self-training must never learn."""

    keys: set = field(default_factory=set)
    fingerprints: set = field(default_factory=set)

    @classmethod
    def of(cls, parquets):
        """The held-out set of every utterance of ``parquets`` (shard folders or their parquets)."""
        held = cls()
        for key, waveform in parquet_audio(parquets):
            held.keys.add(key)
            held.fingerprints.add(audio_fingerprint(waveform))
        logger.info("held out: %d utterance(s) of %s", len(held.keys), ", ".join(map(str, parquets)))
        return held

    def reason(self, key, waveform):
        """Why an utterance is held out (``"key"``, ``"audio"``), or None when it may be pseudo-labelled."""
        if key in self.keys:
            return "key"
        if audio_fingerprint(waveform) in self.fingerprints:
            return "audio"
        return None


@dataclass
class Scored:
    """One decoded utterance: its key, hypothesis and confidence (higher: surer)."""

    key: str
    text: str
    score: float


def decode_scored(trained, items, beam_size=None, batch_seconds=120.0, max_batch_size=32, guard=None,
                  group_size=256):
    """``[Scored]`` of ``(key, waveform)`` items decoded by ``trained`` (``common.inference.TrainedModel``)
    with its joint CTC / attention beam search (and language model); ``guard`` (a ``HeldOut``) drops
    held-out utterances first. Items are read ``group_size`` at a time and batched by length."""
    results, dropped, group = [], {"key": 0, "audio": 0}, []
    for key, waveform in items:
        reason = guard.reason(key, waveform) if guard is not None else None
        if reason:
            dropped[reason] += 1
            continue
        group.append((key, waveform))
        if len(group) == group_size:
            results += _decode_group(trained, group, beam_size, batch_seconds, max_batch_size)
            group = []
    if group:
        results += _decode_group(trained, group, beam_size, batch_seconds, max_batch_size)
    if any(dropped.values()):
        logger.warning("held-out utterances dropped from the pool: %d by key, %d by identical audio",
                       dropped["key"], dropped["audio"])
    return results


@torch.no_grad()
def _decode_group(trained, group, beam_size, batch_seconds, max_batch_size):
    """Scored hypotheses of one group of ``(key, waveform)``, in the group's order."""
    scored = [None] * len(group)
    searcher = trained.beam_searcher(beam_size)
    for batch in length_batches([len(w) for _, w in group], batch_seconds * SAMPLE_RATE, max_batch_size):
        wavs, wav_lens = pad_waveforms([group[i][1] for i in batch], trained.device)
        enc_states = trained.model.encode(wavs, wav_lens)
        hyps, _, scores, _ = searcher(enc_states.detach(), wav_lens)
        texts = ids_to_text(trained.tokenizer.processor, [list(map(int, hyp)) for hyp in hyps])
        best = torch.as_tensor(scores).reshape(len(batch), -1)[:, 0].tolist()
        for index, text, score in zip(batch, texts, best):
            scored[index] = Scored(group[index][0], text, float(score))
    return scored


@dataclass
class Threshold:
    """The chosen confidence threshold and the dev figures behind it."""

    score: float            # keep hypotheses scoring at least this (inf: keep none)
    target_wer: float       # %, the WER the kept dev share had to stay within
    dev_wer: float          # %, WER of all of dev
    kept_dev_wer: float     # %, WER of the dev share kept at the threshold (nan: none)
    kept_dev_share: float   # share of dev utterances at or above the threshold

    def as_dict(self):
        return {name: (None if isinstance(value, float) and not np.isfinite(value) else value)
                for name, value in self.__dict__.items()}


def choose_threshold(dev, references, target_wer=None, wer_ratio=DEFAULT_WER_RATIO, min_share=DEFAULT_MIN_SHARE):
    """The confidence threshold of the module's rule, chosen on ``dev`` (``[Scored]``) against
    ``references`` (``{key: transcript}``): the lowest score of the largest top-scored share of dev (at
    least ``min_share`` of it) whose WER is at most ``target_wer`` % (default ``wer_ratio`` x dev WER)."""
    dev = [s for s in dev if s.key in references]
    if not dev:
        raise UserValueError("no dev hypothesis has a reference: decode the dev split with its transcripts")
    ranked = sorted(dev, key=lambda s: -s.score)
    details = wer_details_for_batch([s.key for s in ranked], [references[s.key].split() for s in ranked],
                                    [s.text.split() for s in ranked])
    edits = np.cumsum([d["num_edits"] for d in details])
    words = np.cumsum([d["num_ref_tokens"] for d in details])
    dev_wer = 100.0 * edits[-1] / max(words[-1], 1)
    target = dev_wer * wer_ratio if target_wer is None else target_wer
    prefix_wer = 100.0 * edits / np.maximum(words, 1)
    least = max(1, int(np.ceil(min_share * len(ranked))))
    meeting = [k for k in range(least, len(ranked) + 1) if prefix_wer[k - 1] <= target]
    if not meeting:
        logger.warning("no top-scored %.0f %% or more of dev has a WER within %.2f %% (dev WER %.2f %%): "
                       "no pseudo-label is kept", 100 * min_share, target, dev_wer)
        return Threshold(float("inf"), target, dev_wer, float("nan"), 0.0)
    kept = max(meeting)
    return Threshold(ranked[kept - 1].score, target, dev_wer, float(prefix_wer[kept - 1]), kept / len(ranked))


def keep_confident(scored, threshold):
    """``{key: hypothesis}`` of the non-empty hypotheses scoring at least ``threshold``."""
    return {s.key: s.text for s in scored if s.score >= threshold and s.text.strip()}


def keep_top_share(scored, share):
    """``{key: hypothesis}`` of the non-empty hypotheses among the top-scored ``share`` of ``scored``
    (rounded up; none when ``share`` is 0). The rule for a pool whose scores sit apart from dev's: a
    labeller is less sure of voices it has not heard, right or wrong, so dev's score keeps almost none of
    them while the order within the pool still tells its better hypotheses from its worse."""
    if share <= 0 or not scored:
        return {}
    count = int(np.ceil(share * len(scored) - 1e-9))  # 0.6 x 10 must give 6 when the float product is 6.0000001
    ranked = sorted(scored, key=lambda s: -s.score)[:count]
    return {s.key: s.text for s in ranked if s.text.strip()}


def write_pseudo_parquet(pool_parquets, texts, path):
    """Write the rows of ``pool_parquets`` whose key is in ``texts`` with that text as transcript to
    ``path``: a shard parquet (``common.shard_format``) whose ``shard_name`` points at the pool's tars
    relative to ``path``'s folder, so a finetune reads it beside the labelled parquet. Returns the rows."""
    folder = os.path.dirname(os.path.abspath(path))
    rows = []
    for parquet in map(pool_parquet, pool_parquets):
        shard_dir = os.path.dirname(os.path.abspath(parquet))
        for row in pq.read_table(parquet).to_pylist():
            if row["sample_key"] in texts:
                row["text"] = texts[row["sample_key"]]
                row["shard_name"] = os.path.relpath(os.path.join(shard_dir, row["shard_name"]), folder)
                rows.append(row)
    os.makedirs(folder, exist_ok=True)
    write_metadata(rows, path)
    return rows


def write_scored(scored, kept, path):
    """Every pool hypothesis as a JSON line ``{"key", "text", "score", "kept"}`` (a record to inspect);
    ``kept``: the keys kept."""
    lines = "".join(json.dumps({"key": s.key, "text": s.text, "score": round(s.score, 5), "kept": s.key in kept},
                               ensure_ascii=False) + "\n" for s in scored)
    atomic_write_text(path, lines)


def export_as_checkpoint(exp_dir, folder):
    """The averaged model of a finetune experiment as a checkpoint folder (``model.ckpt``,
    ``normalize.ckpt``) that another finetune starts from with ``--pretrained=<folder>``."""
    state = torch.load(os.path.join(exp_dir, AVERAGED_FILE), map_location="cpu")
    checkpoint = os.path.join(folder, "CKPT+averaged")
    os.makedirs(checkpoint, exist_ok=True)
    for name in ("model", "normalize"):
        with atomic_path(os.path.join(checkpoint, f"{name}.ckpt")) as temporary:
            torch.save(state[name], temporary)
    return checkpoint
