"""Joint speech-text pretraining around the shared ``SpeechEncoderDecoder`` (SpeechUT / YiTrans idea).

Three tasks share the finetune graph's weights:

- **speech** (masked unit prediction, HuBERT): Fbank → front-end → ``transformer.custom_src_module``;
  span-masked frames are replaced by a learned ``mask_embedding``; the Conformer encoder's states
  predict the k-means unit of each frame through ``unit_head``.
- **text** (denoising) and **paired** (translation): source tokens are embedded with the decoder's
  token embedding (``transformer.custom_tgt_module``, shared), run through the same encoder, and the
  decoder (``transformer.decoder`` + ``seq_lin``) produces the target, teacher-forced.
- **text** as a language model (``text_task: lm``): the decoder alone predicts the sentence, its
  cross-attention reading one zero frame (no source): the attention decoder learns the language
  before it hears any speech, and the encoder is left to the speech.

- **unit decoder** (Speech2C's ``add_decoder``, with the speech task): the same decoder layers, reading
  the masked speech's encoder states, predict the frame targets with repeats merged (``a a b b a`` →
  ``a b a``) through their own unit embedding and output layer (``PretrainHeads``), teacher-forced.

The speech targets are k-means units of MFCCs (``local/extract_units.py``, a field of the speech batch) or BEST-RQ
codes (``BestRqTargets``: SpeechBrain's ``RandomProjectionQuantizer`` on per-utterance normalised Fbank
frames stacked to the encoder frame rate, computed in the pass, fixed by a seed).

Only ``PretrainHeads`` (``unit_head``, ``mask_embedding``, the BEST-RQ quantiser) is new; the graph keeps the names of
``common/models/encoder_decoder.py``, so its checkpoint (``model.ckpt``) loads into finetuning by
name. ``JointPretrainModel.forward`` dispatches on the task, so one DDP wrapper covers every batch
(run with ``find_unused_parameters``: a text batch leaves the front-end unused).
"""

import logging
import math
from typing import NamedTuple

import torch
from speechbrain.lobes.models.transformer.Transformer import NormalizedEmbedding
from speechbrain.lobes.models.transformer.TransformerASR import make_transformer_src_tgt_masks
from speechbrain.nnet.quantisers import RandomProjectionQuantizer
from speechbrain.processing.features import InputNormalization, make_padding_mask

from common.data.units import UNIT_TOKEN_OFFSET, count_units, deduplicated_unit_sequences
from common.tokens import BLANK

logger = logging.getLogger(__name__)

SPEECH_TASK, TEXT_TASKS, LM_TASK, TRANSCRIBED_TASK = "speech", ("text", "paired"), "text_lm", "transcribed"
TEXT_TASK_KINDS = ("denoise", "lm")  # how mono text trains (the ``text_task`` option)


class MaskedSpeechOutput(NamedTuple):
    """Masked unit prediction pass: logits over units, where frames were masked, encoder states."""

    unit_logits: torch.Tensor  # [batch, frames, n_units]
    frame_mask: torch.Tensor  # [batch, frames], True where the input frame was masked
    enc_states: torch.Tensor  # [batch, frames, d_model]
    targets: torch.Tensor = None  # [batch, frames] BEST-RQ codes or k-means units (-1: no unit), None: none given
    voiced: torch.Tensor = None  # [batch, frames], True on frames louder than silence (``voiced_frames``)
    unit_decoder_log_probs: torch.Tensor = None  # [batch, units + 1, n_units + 3] with add_decoder, else None
    unit_tokens_eos: torch.Tensor = None  # its targets: deduplicated units + 3, then EOS (padded with 0)
    unit_tokens_lens: torch.Tensor = None  # their relative lengths


class BestRqTargets(torch.nn.Module):
    """BEST-RQ targets (Chiu et al. 2022): each encoder frame's Fbank frames, stacked, projected by a
    frozen random matrix and matched to the nearest of a frozen random codebook
    (``speechbrain.nnet.quantisers.RandomProjectionQuantizer``). Features are normalised per utterance
    (mean and variance of its own frames), so the targets depend on the audio and the seed only, not on
    the model's running statistics: the same from the first update to the last.

    Arguments
    ---------
    n_mels : int
        Fbank bins.
    stack : int
        Fbank frames (10 ms) per encoder frame: the front-end's total stride.
    codebook_size, codebook_dim : int
        BEST-RQ: 8192 x 16 on 60k hours; a few hours want a few hundred codes.
    seed : int
        Fixes the projection and the codebook (stored as buffers in the checkpoint too).
    """

    def __init__(self, n_mels, stack, codebook_size=512, codebook_dim=16, seed=0):
        super().__init__()
        self.stack = stack
        self.normalize = InputNormalization(norm_type="sentence")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.quantiser = RandomProjectionQuantizer(n_mels * stack, codebook_dim, codebook_size)

    def forward(self, feats, rel_lens, num_frames):
        """Codes [batch, num_frames] of raw Fbank ``feats`` [batch, time, n_mels] (relative lengths)."""
        batch, time, n_mels = feats.shape
        normalised = self.normalize(feats, rel_lens).masked_fill(~make_padding_mask(feats, rel_lens), 0.0)
        wanted = num_frames * self.stack
        normalised = torch.nn.functional.pad(normalised, (0, 0, 0, max(0, wanted - time)))[:, :wanted]
        stacked = normalised.reshape(batch, num_frames, self.stack * n_mels)
        return self.quantiser(stacked.float())


def voiced_frames(fbank, rel_lens, num_frames, silence_db=30.0):
    """Which encoder frames hold sound, not silence: True where the loudest Fbank frame under an encoder
    frame comes within ``silence_db`` of the utterance's loudest frame (masked accuracy on voiced frames:
    silence is easy to predict and inflates the plain masked accuracy).

    Arguments
    ---------
    fbank : torch.Tensor
        Log-mel features in dB [batch, time, n_mels] (SpeechBrain's ``Fbank``), before normalisation.
    rel_lens : torch.Tensor
        Relative lengths [batch].
    num_frames : int
        Encoder frames of the padded batch; each covers ``time / num_frames`` Fbank frames.
    silence_db : float
        How far below the utterance's peak frame energy a frame counts as silence.

    Returns
    -------
    torch.BoolTensor
        [batch, num_frames]; False past each utterance's length.
    """
    batch, time, _ = fbank.shape
    energy = torch.logsumexp(fbank.float() * (math.log(10.0) / 10.0), dim=-1) * (10.0 / math.log(10.0))
    energy = energy.masked_fill(~make_padding_mask(fbank, rel_lens)[..., 0], float("-inf"))
    stack = max(1, math.ceil(time / num_frames))
    padded = num_frames * stack
    energy = torch.nn.functional.pad(energy, (0, padded - time), value=float("-inf"))[:, :padded]
    frame_energy = energy.reshape(batch, num_frames, stack).amax(dim=-1)
    peak = frame_energy.amax(dim=1, keepdim=True)
    return frame_energy >= peak - silence_db


def make_bestrq_targets(speech_targets, n_mels, stack, codebook_size, codebook_dim, seed):
    """The ``BestRqTargets`` of ``speech_targets: bestrq``, None for ``kmeans`` (configs call this)."""
    check_speech_targets(speech_targets)
    if speech_targets != "bestrq":
        return None
    return BestRqTargets(n_mels, int(stack), codebook_size, codebook_dim, seed)


def count_targets(speech_targets, units_dirs, codebook_size):
    """Classes of the unit head: the k-means clusters of ``units_dirs``, or the BEST-RQ codebook size."""
    check_speech_targets(speech_targets)
    if speech_targets == "bestrq":
        return codebook_size
    if not units_dirs:
        raise ValueError("speech_targets: kmeans needs units_dirs (local/extract_units.py folders), "
                         "or set speech_targets: bestrq")
    return count_units(units_dirs)


def check_speech_targets(speech_targets):
    if speech_targets not in ("kmeans", "bestrq"):
        raise ValueError(f"speech_targets: {speech_targets!r}: use kmeans or bestrq")


def check_text_task(text_task):
    if text_task not in TEXT_TASK_KINDS:
        raise ValueError(f"text_task: {text_task!r}: use one of {TEXT_TASK_KINDS}")


class PretrainHeads(torch.nn.Module):
    """Pretraining-only weights (not loaded by finetuning).

    Arguments
    ---------
    d_model : int
        Encoder width.
    n_units : int
        k-means clusters (``kmeans.json``'s ``n_units``) or BEST-RQ codes.
    bestrq : BestRqTargets, optional
        Computes the speech targets in the pass (None: k-means units from the batch).
    add_decoder : bool
        Speech2C's unit decoder: a unit embedding and an output layer over the ``n_units`` units plus
        pad / BOS / EOS (``unit_embedding``, ``unit_decoder_head``) around the shared decoder layers.
    """

    def __init__(self, d_model, n_units, bestrq=None, add_decoder=False):
        super().__init__()
        self.unit_head = torch.nn.Linear(d_model, n_units)
        self.mask_embedding = torch.nn.Parameter(torch.empty(d_model).uniform_())  # as HuBERT
        self.bestrq = bestrq
        self.unit_embedding, self.unit_decoder_head = None, None
        if add_decoder:
            self.unit_embedding = NormalizedEmbedding(d_model, n_units + UNIT_TOKEN_OFFSET)
            self.unit_decoder_head = torch.nn.Linear(d_model, n_units + UNIT_TOKEN_OFFSET)
        if bestrq is not None and bestrq.quantiser.cb_vocab != n_units:
            raise ValueError(f"n_units={n_units} but the BEST-RQ codebook has {bestrq.quantiser.cb_vocab} codes: "
                             "set n_units to bestrq_codebook_size")


def encode_embedded(transformer, src, rel_lens):
    """Run ``transformer.encoder`` on inputs already at ``d_model`` ([batch, frames, d_model]).

    The part of ``TransformerASR.forward`` after ``custom_src_module``: padding mask from the
    relative lengths, then positions by the transformer's attention type.
    Returns (encoder states, key padding mask [batch, frames], True on padding).
    """
    padding_mask, _, src_mask, _ = make_transformer_src_tgt_masks(
        src, None, rel_lens, pad_idx=BLANK, causal=transformer.causal)
    pos_embs = None
    if transformer.attention_type == "RelPosMHAXL":
        pos_embs = transformer.positional_encoding(src)
    elif transformer.positional_encoding_type == "fixed_abs_sine":
        src = src + transformer.positional_encoding(src)
    encoder_out, _ = transformer.encoder(src=src, src_mask=src_mask, src_key_padding_mask=padding_mask,
                                         pos_embs=pos_embs)
    return encoder_out, padding_mask


def decode_teacher_forced(transformer, tokens_bos, enc_states, enc_padding_mask, embed=None):
    """Decoder states [batch, target + 1, d_model] given ``tokens_bos``, with gradients.

    The decoder half of ``TransformerASR.forward`` (``TransformerASR.decode`` is a no-grad
    inference step): causal target mask, token padding mask, positions by attention type.
    ``embed`` embeds the tokens (default: the text embedding ``transformer.custom_tgt_module``).
    """
    _, tgt_padding_mask, _, tgt_mask = make_transformer_src_tgt_masks(
        enc_states, tokens_bos, None, pad_idx=BLANK)
    tgt = (embed or transformer.custom_tgt_module)(tokens_bos)
    if transformer.attention_type in ("RelPosMHAXL", "RoPEMHA"):
        tgt = tgt + transformer.positional_encoding_decoder(tgt)
    elif transformer.positional_encoding_type == "fixed_abs_sine" or transformer.attention_type == "hypermixing":
        tgt = tgt + transformer.positional_encoding(tgt)
    dec_states, _, _ = transformer.decoder(
        tgt=tgt, memory=enc_states, memory_mask=None, tgt_mask=tgt_mask,
        tgt_key_padding_mask=tgt_padding_mask, memory_key_padding_mask=enc_padding_mask,
        pos_embs_tgt=None, pos_embs_src=None)
    return dec_states


def text_to_text(model, src_tokens, src_lens, tokens_bos):
    """The text path of a ``SpeechEncoderDecoder``: source tokens [batch, length] (relative lengths
    [batch]) embedded by the decoder's token embedding, through the shared encoder, then decoder
    log-probabilities [batch, target length + 1, vocab] given ``tokens_bos`` (teacher forcing). Paired
    text in pretraining, machine translation batches in a multitask finetune."""
    transformer = model.transformer
    enc_states, padding_mask = encode_embedded(transformer, transformer.custom_tgt_module(src_tokens), src_lens)
    dec_states = decode_teacher_forced(transformer, tokens_bos, enc_states, padding_mask)
    return torch.log_softmax(model.seq_lin(dec_states), dim=-1)


class JointPretrainModel(torch.nn.Module):
    """The shared graph (``model``) plus ``heads``; ``forward(task, ...)`` runs one task's pass.

    Arguments
    ---------
    model : common.models.SpeechEncoderDecoder
        Build it with ``spec_augment_prob: 0.0``: masking is the speech task's corruption.
    heads : PretrainHeads
    silence_db : float
        Frames this far below an utterance's loudest are silence (``voiced_frames``: the masked accuracy
        on voiced frames, a diagnostic; it changes no loss).
    """

    def __init__(self, model, heads, silence_db=30.0):
        super().__init__()
        self.model = model
        self.heads = heads
        self.silence_db = silence_db

    def forward(self, task, *inputs, **kwargs):
        """``speech``: see ``masked_speech``; ``text`` / ``paired``: see ``text_to_text``; ``text_lm``:
        see ``language_model``; ``transcribed``: the finetuning pass of the graph (``SpeechEncoderDecoder``:
        CTC and decoder log-probabilities of labelled speech)."""
        if task == SPEECH_TASK:
            return self.masked_speech(*inputs, **kwargs)
        if task == TRANSCRIBED_TASK:
            return self.model(*inputs, **kwargs)
        if task in TEXT_TASKS:
            return self.text_to_text(*inputs, **kwargs)
        if task == LM_TASK:
            return self.language_model(*inputs, **kwargs)
        raise ValueError(f"unknown task {task!r}: use {SPEECH_TASK}, {LM_TASK}, {TRANSCRIBED_TASK} or one of "
                         f"{TEXT_TASKS}")

    def masked_speech(self, wavs, wav_lens, mask_frames, epoch=None, frame_targets=None):
        """Masked unit prediction pass (and, with the heads' unit decoder, the unit sequence).

        Arguments
        ---------
        wavs, wav_lens : torch.Tensor
            Padded 16 kHz waveforms [batch, samples] and relative lengths [batch].
        mask_frames : callable
            ``mask_frames(frame_lengths, num_frames) -> BoolTensor [batch, num_frames]`` (e.g.
            ``common.masking.mask_spans`` with its options bound), called on encoder-input frames.
        frame_targets : callable, optional
            ``frame_targets(num_frames) -> LongTensor [batch, num_frames]``: k-means units at the encoder
            frames (-1: none). Not needed with BEST-RQ heads, which compute the codes here.
        """
        model = self.model
        fbank = model.compute_features(wavs) if wavs.dim() == 2 else wavs  # (the loader's, when it made them)
        src = model.frontend(model.extract_features(fbank, wav_lens, epoch))
        targets = None
        if self.heads.bestrq is not None:
            with torch.no_grad():
                targets = self.heads.bestrq(fbank, wav_lens, src.shape[1])
        elif frame_targets is not None:
            targets = frame_targets(src.shape[1]).to(src.device)
        src = model.transformer.custom_src_module(src.flatten(start_dim=2))
        lengths = torch.round(wav_lens * src.shape[1]).long()
        frame_mask = mask_frames(lengths.cpu(), src.shape[1]).to(src.device)
        src = torch.where(frame_mask.unsqueeze(-1), self.heads.mask_embedding.to(src.dtype), src)
        enc_states, padding_mask = encode_embedded(model.transformer, src, wav_lens)
        with torch.no_grad():
            voiced = voiced_frames(fbank, wav_lens, src.shape[1], self.silence_db)
        output = MaskedSpeechOutput(self.heads.unit_head(enc_states), frame_mask, enc_states, targets, voiced)
        if self.heads.unit_decoder_head is None:
            return output
        if targets is None:
            raise ValueError("the unit decoder (add_decoder) needs the frame targets: pass frame_targets")
        return output._replace(**self.decode_units(enc_states, padding_mask, targets, lengths))

    def decode_units(self, enc_states, padding_mask, targets, lengths):
        """Speech2C's decoder term: the deduplicated ``targets`` (valid frames: ``lengths`` and >= 0),
        teacher-forced through the unit embedding, the shared decoder layers and the unit output layer."""
        lengths = torch.minimum(lengths.to(targets.device), (targets >= 0).sum(dim=1))
        tokens_bos, tokens_eos, rel_lens = deduplicated_unit_sequences(targets, lengths)
        dec_states = decode_teacher_forced(self.model.transformer, tokens_bos, enc_states, padding_mask,
                                           embed=self.heads.unit_embedding)
        log_probs = torch.log_softmax(self.heads.unit_decoder_head(dec_states), dim=-1)
        return {"unit_decoder_log_probs": log_probs, "unit_tokens_eos": tokens_eos, "unit_tokens_lens": rel_lens}

    def text_to_text(self, src_tokens, src_lens, tokens_bos):
        """Source tokens [batch, length] (relative lengths [batch]) → decoder log-probabilities
        [batch, target length + 1, vocab] given ``tokens_bos`` (teacher forcing)."""
        return text_to_text(self.model, src_tokens, src_lens, tokens_bos)

    def language_model(self, tokens_bos):
        """Decoder log-probabilities [batch, length, vocab] of ``tokens_bos`` with no source: the
        cross-attention reads one zero frame, so only its output bias trains, and the decoder's
        self-attention and feed-forward layers learn the language."""
        memory = tokens_bos.new_zeros(tokens_bos.shape[0], 1, self.model.seq_lin.w.in_features, dtype=torch.float)
        dec_states = decode_teacher_forced(self.model.transformer, tokens_bos, memory, None)
        return torch.log_softmax(self.model.seq_lin(dec_states), dim=-1)
