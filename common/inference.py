"""Use a trained finetune experiment: load its averaged model, cut long recordings, decode batches.

An experiment folder (``recipes/finetune/train.py``'s ``output_folder``) holds the resolved config
(``hyperparams.yaml``) and, after its test stage, the averaged weights with the feature statistics
(``averaged.ckpt``). ``load_trained`` rebuilds the model graph from the config alone (no data, no
loggers, no checkpointer) and loads those weights::

    trained = load_trained("exp/finetune_small")
    texts = trained.transcribe([waveform1, waveform2])        # float32 16 kHz mono arrays
    texts = trained.transcribe(waveforms, search="ctc_greedy")

``split_at_silences`` cuts a recording longer than the model ever saw into pieces at its quietest
moments; ``length_batches`` groups pieces of similar length under a padded-seconds budget.
"""

import filecmp
import logging
import os
from dataclasses import dataclass

import numpy as np
import torch
from hyperpyyaml import load_hyperpyyaml

from common.audio_io import SAMPLE_RATE
from common.data import Tokenizer, vocab_size
from common.decoding import beam_search, build_beam_searcher, ctc_greedy, ids_to_text
from common.models.experiment import AVERAGED_FILE, graph_yaml, read_config_tree
from common.models.transfer import TOKENIZER_COPY
from common.user_errors import UserValueError

logger = logging.getLogger(__name__)

LM_CHECKPOINT = "lm.ckpt"
SEARCHES = ("beam", "ctc_greedy")
DEFAULT_MAX_DURATION = 30.0  # s: the longest piece decoded when the config sets no max_duration filter
# The config's decoding keys, as the test stage used them.
DECODING_KEYS = ("beam_size", "ctc_weight", "length_normalization", "length_bonus", "max_decode_ratio")


def decoding_settings(tree):
    """``{key: value}`` of the config's decoding keys, plus ``prefix_tokens``, the language model
    (``lm_dir``, ``lm_weight``) and the longest training utterance (``max_duration``, seconds; the
    loader's filter, or DEFAULT_MAX_DURATION without one)."""
    settings = {key: tree[key] for key in DECODING_KEYS}
    settings["prefix_tokens"] = list(tree.get("prefix_tokens") or [])
    settings["lm_dir"], settings["lm_weight"] = tree.get("lm_dir"), float(tree.get("lm_weight") or 0.0)
    filters = tree.get("train_loader", {}).get("filters") or {}
    settings["max_duration"] = float(filters.get("max_duration") or DEFAULT_MAX_DURATION)
    return settings


def averaged_checkpoint(exp_dir):
    """Path of the experiment's averaged weights; raises with the command that writes them."""
    path = os.path.join(exp_dir, AVERAGED_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} is missing: the test stage writes it (bash recipes/finetune/run.sh --stage 3 ..., "
            "or train.py with --do_train=False --do_test=True)")
    return path


@dataclass
class TrainedModel:
    """A finetuned model ready to decode: ``model`` (eval mode), ``tokenizer``, ``settings``."""

    model: torch.nn.Module
    tokenizer: Tokenizer
    settings: dict
    device: str = "cpu"

    def __post_init__(self):
        self.prefix_ids = [self.tokenizer.piece_id(token) for token in self.settings["prefix_tokens"]]
        self.searcher = None
        self.lm = None
        if self.settings["lm_dir"] and self.settings["lm_weight"] > 0.0:
            self.lm = load_language_model(self.settings["lm_dir"], self.tokenizer.model_path, self.device)

    def beam_searcher(self, beam_size):
        """The joint CTC/attention searcher of the config (``beam_size`` overrides its beam), with
        its language model when it has one."""
        options = {key: self.settings[key] for key in DECODING_KEYS}
        options["beam_size"] = beam_size or options["beam_size"]
        if self.searcher is None or self.searcher.beam_size != options["beam_size"]:
            self.searcher = build_beam_searcher(self.model, prefix_tokens=self.prefix_ids, lm=self.lm,
                                                lm_weight=self.settings["lm_weight"], **options)
        return self.searcher

    @torch.no_grad()
    def transcribe(self, waveforms, search="beam", beam_size=None):
        """One text per waveform (float32 16 kHz mono arrays), decoded as one padded batch."""
        if search not in SEARCHES:
            raise ValueError(f"search={search!r}: use one of {SEARCHES}")
        wavs, wav_lens = pad_waveforms(waveforms, self.device)
        enc_states = self.model.encode(wavs, wav_lens)
        if search == "ctc_greedy":
            ids = ctc_greedy(self.model.ctc_log_probs(enc_states), wav_lens)
        else:
            ids = beam_search(self.beam_searcher(beam_size), enc_states, wav_lens)
        return ids_to_text(self.tokenizer.processor, ids)


def load_trained(exp_dir, device="cpu", tokenizer_file=None, **settings):
    """The averaged model of a finetune experiment, its tokenizer and decoding settings.

    ``tokenizer_file`` defaults to the config's (relative paths are read from the current folder);
    ``settings`` (e.g. ``lm_dir``, ``lm_weight``) replace the config's decoding settings.
    """
    tree = read_config_tree(exp_dir)
    tokenizer_file = tokenizer_file or tree["tokenizer_file"]
    if not os.path.isfile(tokenizer_file):
        raise FileNotFoundError(f"tokenizer {tokenizer_file} (the config's tokenizer_file) does not exist: "
                                "run from the folder the experiment was trained in, or pass its path")
    graph = load_hyperpyyaml(graph_yaml(tree, vocab_size(tokenizer_file)))
    model = graph["model"]
    state = torch.load(averaged_checkpoint(exp_dir), map_location="cpu")
    model.load_state_dict(state["model"], strict=True)
    if state.get("normalize") is not None:
        model.normalize._load_statistics_dict(state["normalize"])
    model.to(device).eval()
    logger.info("loaded %s (%s) on %s", averaged_checkpoint(exp_dir), tokenizer_file, device)
    return TrainedModel(model, Tokenizer(tokenizer_file), {**decoding_settings(tree), **settings}, device)


def load_language_model(lm_dir, tokenizer_file, device="cpu"):
    """The averaged language model of a ``recipes/lm`` experiment (``lm_model`` of its config, weights
    in ``lm.ckpt``), in eval mode; raises when it was trained on another tokenizer's pieces."""
    copy = os.path.join(lm_dir, TOKENIZER_COPY)
    if not os.path.isfile(copy) or not filecmp.cmp(copy, tokenizer_file, shallow=False):
        raise UserValueError(f"the language model {lm_dir} was not trained with {tokenizer_file} (its copy "
                             f"{copy} differs or is missing): train it with --tokenizer_file={tokenizer_file}")
    path = os.path.join(lm_dir, LM_CHECKPOINT)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: recipes/lm/train.py writes it when training ends")
    tree = read_config_tree(lm_dir)
    lm = load_hyperpyyaml(graph_yaml(tree, vocab_size(tokenizer_file), block="lm_model"))["lm_model"]
    lm.load_state_dict(torch.load(path, map_location="cpu")["model"], strict=True)
    logger.info("language model %s (%s)", path, type(lm).__name__)
    return lm.to(device).eval()


def pad_waveforms(waveforms, device="cpu"):
    """``(wavs [batch, samples], relative lengths [batch])`` of 1-D float arrays, zero-padded."""
    longest = max(len(w) for w in waveforms)
    wavs = torch.zeros(len(waveforms), longest)
    for row, waveform in enumerate(waveforms):
        wavs[row, :len(waveform)] = torch.as_tensor(waveform)
    wav_lens = torch.tensor([len(w) / longest for w in waveforms])
    return wavs.to(device), wav_lens.to(device)


def split_at_silences(samples, max_seconds, rate=SAMPLE_RATE, frame_seconds=0.025, search_from=0.5):
    """``[(start, end), ...]`` sample ranges covering ``samples``, none longer than ``max_seconds``.

    A recording that fits is one range. Otherwise each cut falls at the quietest 25 ms frame (lowest
    energy) in the last ``1 - search_from`` of the window that still fits, so pieces end in pauses
    where the recording has them, and never exceed the length the model was trained on.
    """
    limit, frame = int(max_seconds * rate), max(1, int(frame_seconds * rate))
    if limit < 2 * frame:
        raise ValueError(f"max_seconds={max_seconds} is too short to cut at silences (at least "
                         f"{2 * frame_seconds} s)")
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


def length_batches(lengths, max_batch_samples, max_batch_size):
    """Index lists of items sorted by length (longest first), each batch's padded size (count x
    longest) within ``max_batch_samples`` and at most ``max_batch_size`` items; an item longer than
    the budget gets a batch of its own."""
    batches, current = [], []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        longest = lengths[current[0]] if current else lengths[index]
        if current and ((len(current) + 1) * longest > max_batch_samples or len(current) == max_batch_size):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches
