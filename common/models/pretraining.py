"""Joint speech-text pretraining around the shared ``SpeechEncoderDecoder`` (SpeechUT / YiTrans idea).

Three tasks share the finetune graph's weights:

- **speech** (masked unit prediction, HuBERT): Fbank → front-end → ``transformer.custom_src_module``;
  span-masked frames are replaced by a learned ``mask_embedding``; the Conformer encoder's states
  predict the k-means unit of each frame through ``unit_head``.
- **text** (denoising) and **paired** (translation): source tokens are embedded with the decoder's
  token embedding (``transformer.custom_tgt_module``, shared), run through the same encoder, and the
  decoder (``transformer.decoder`` + ``seq_lin``) produces the target, teacher-forced.

Only ``PretrainHeads`` (``unit_head``, ``mask_embedding``) is new; the graph keeps the names of
``common/models/encoder_decoder.py``, so its checkpoint (``model.ckpt``) loads into finetuning by
name. ``JointPretrainModel.forward`` dispatches on the task, so one DDP wrapper covers every batch
(run with ``find_unused_parameters``: a text batch leaves the front-end unused).
"""

import logging
from typing import NamedTuple

import torch
from speechbrain.lobes.models.transformer.TransformerASR import make_transformer_src_tgt_masks

from common.tokens import BLANK

logger = logging.getLogger(__name__)

SPEECH_TASK, TEXT_TASKS = "speech", ("text", "paired")


class MaskedSpeechOutput(NamedTuple):
    """Masked unit prediction pass: logits over units, where frames were masked, encoder states."""

    unit_logits: torch.Tensor  # [batch, frames, n_units]
    frame_mask: torch.Tensor  # [batch, frames], True where the input frame was masked
    enc_states: torch.Tensor  # [batch, frames, d_model]


class PretrainHeads(torch.nn.Module):
    """Pretraining-only weights (not loaded by finetuning).

    Arguments
    ---------
    d_model : int
        Encoder width.
    n_units : int
        k-means clusters (``kmeans.json``'s ``n_units``).
    """

    def __init__(self, d_model, n_units):
        super().__init__()
        self.unit_head = torch.nn.Linear(d_model, n_units)
        self.mask_embedding = torch.nn.Parameter(torch.empty(d_model).uniform_())  # as HuBERT


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


def decode_teacher_forced(transformer, tokens_bos, enc_states, enc_padding_mask):
    """Decoder states [batch, target + 1, d_model] given ``tokens_bos``, with gradients.

    The decoder half of ``TransformerASR.forward`` (``TransformerASR.decode`` is a no-grad
    inference step): causal target mask, token padding mask, positions by attention type.
    """
    _, tgt_padding_mask, _, tgt_mask = make_transformer_src_tgt_masks(
        enc_states, tokens_bos, None, pad_idx=BLANK)
    tgt = transformer.custom_tgt_module(tokens_bos)
    if transformer.attention_type in ("RelPosMHAXL", "RoPEMHA"):
        tgt = tgt + transformer.positional_encoding_decoder(tgt)
    elif transformer.positional_encoding_type == "fixed_abs_sine" or transformer.attention_type == "hypermixing":
        tgt = tgt + transformer.positional_encoding(tgt)
    dec_states, _, _ = transformer.decoder(
        tgt=tgt, memory=enc_states, memory_mask=None, tgt_mask=tgt_mask,
        tgt_key_padding_mask=tgt_padding_mask, memory_key_padding_mask=enc_padding_mask,
        pos_embs_tgt=None, pos_embs_src=None)
    return dec_states


class JointPretrainModel(torch.nn.Module):
    """The shared graph (``model``) plus ``heads``; ``forward(task, ...)`` runs one task's pass.

    Arguments
    ---------
    model : common.models.SpeechEncoderDecoder
        Build it with ``spec_augment_prob: 0.0``: masking is the speech task's corruption.
    heads : PretrainHeads
    """

    def __init__(self, model, heads):
        super().__init__()
        self.model = model
        self.heads = heads

    def forward(self, task, *inputs, **kwargs):
        """``speech``: see ``masked_speech``; ``text`` / ``paired``: see ``text_to_text``."""
        if task == SPEECH_TASK:
            return self.masked_speech(*inputs, **kwargs)
        if task in TEXT_TASKS:
            return self.text_to_text(*inputs, **kwargs)
        raise ValueError(f"unknown task {task!r}: use {SPEECH_TASK} or one of {TEXT_TASKS}")

    def masked_speech(self, wavs, wav_lens, mask_frames, epoch=None):
        """Masked unit prediction pass.

        Arguments
        ---------
        wavs, wav_lens : torch.Tensor
            Padded 16 kHz waveforms [batch, samples] and relative lengths [batch].
        mask_frames : callable
            ``mask_frames(frame_lengths, num_frames) -> BoolTensor [batch, num_frames]`` (e.g.
            ``common.masking.mask_spans`` with its options bound), called on encoder-input frames.
        """
        model = self.model
        src = model.frontend(model.extract_features(wavs, wav_lens, epoch))
        src = model.transformer.custom_src_module(src.flatten(start_dim=2))
        lengths = torch.round(wav_lens * src.shape[1]).long()
        frame_mask = mask_frames(lengths.cpu(), src.shape[1]).to(src.device)
        src = torch.where(frame_mask.unsqueeze(-1), self.heads.mask_embedding.to(src.dtype), src)
        enc_states, _ = encode_embedded(model.transformer, src, wav_lens)
        return MaskedSpeechOutput(self.heads.unit_head(enc_states), frame_mask, enc_states)

    def text_to_text(self, src_tokens, src_lens, tokens_bos):
        """Source tokens [batch, length] (relative lengths [batch]) → decoder log-probabilities
        [batch, target length + 1, vocab] given ``tokens_bos`` (teacher forcing)."""
        transformer = self.model.transformer
        enc_states, padding_mask = encode_embedded(transformer, transformer.custom_tgt_module(src_tokens),
                                                   src_lens)
        dec_states = decode_teacher_forced(transformer, tokens_bos, enc_states, padding_mask)
        return torch.log_softmax(self.model.seq_lin(dec_states), dim=-1)
