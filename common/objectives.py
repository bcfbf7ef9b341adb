"""Training objectives.

``masked_unit_loss`` is HuBERT's masked prediction loss (pretraining, speech); ``sequence_loss`` the
teacher-forced decoder term (pretraining, text; and the NLL half of the joint loss).

``joint_ctc_attention_loss`` is SpeechUT's ``ctc_ce`` criterion:
``loss = (1 - dec_weight) * CTC + dec_weight * label-smoothed NLL``: torch's CTC (``zero_infinity``, as
``speechbrain.nnet.losses.ctc_loss`` calls it) and SpeechBrain's NLL. With
intermediate CTC (ESPnet's ``interctc_weight``), ``CTC = (1 - inter_ctc_weight) * CTC(last layer) +
inter_ctc_weight * mean CTC(intermediate layers)``.

``loss_reduction`` sets how a batch's utterances add up: ``token`` (each CTC term per target token, then
the batch mean; the NLL per decoder token) or ``utterance`` (each utterance's summed loss, averaged over
the batch: SpeechBrain's ``batchmean``, what its LibriSpeech recipes, ESPnet and WeNet train with).
The logged ``ctc_loss`` and ``nll_loss`` are per token under either, so runs compare.
"""

import logging

import torch
from speechbrain.nnet.losses import nll_loss
from speechbrain.utils.Accuracy import Accuracy

from common.tokens import BLANK

logger = logging.getLogger(__name__)

REDUCTIONS = ("token", "utterance")


def check_reduction(loss_reduction):
    """Raises ValueError unless ``loss_reduction`` is one of REDUCTIONS."""
    if loss_reduction not in REDUCTIONS:
        raise ValueError(f"loss_reduction={loss_reduction!r}: use one of {', '.join(REDUCTIONS)}")


def token_counts(rel_lens, padded_len):
    """Absolute token counts of relative lengths, rounded as SpeechBrain's losses round them."""
    return torch.round(rel_lens * padded_len)


def reduced_ctc(log_probs, tokens, wav_lens, tokens_lens, loss_reduction):
    """``(loss to back-propagate, per-token figure)`` of one CTC pass over the batch: each utterance's
    summed loss (lengths rounded and infinities zeroed as ``speechbrain.nnet.losses.ctc_loss`` does);
    the figure divides each by its target length (at least 1) and averages, as torch's ``mean``."""
    target_lens = token_counts(tokens_lens, tokens.shape[1]).long()
    sums = torch.nn.functional.ctc_loss(
        log_probs.transpose(0, 1), tokens, token_counts(wav_lens, log_probs.shape[1]).long(), target_lens,
        blank=BLANK, reduction="none", zero_infinity=True)
    figure = (sums / target_lens.clamp(min=1)).mean()
    return (figure if loss_reduction == "token" else sums.mean()), figure



def drop_prefix(tokens, rel_lens, num_tokens):
    """Removes the first ``num_tokens`` positions of every padded sequence.

    Arguments
    ---------
    tokens : torch.Tensor
        Padded sequences [batch, length, ...] (token ids or per-token log-probabilities).
    rel_lens : torch.Tensor
        Relative lengths [batch] (1.0 = the longest sequence).
    num_tokens : int
        How many leading positions to drop (e.g. 1 for a language tag such as ``<en>``).

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        The shortened sequences and their relative lengths against the new padded length.
    """
    if num_tokens == 0:
        return tokens, rel_lens
    padded_len = tokens.shape[1]
    if num_tokens >= padded_len:
        raise ValueError(
            f"ignore_prefix_tokens={num_tokens} leaves nothing of targets that are at most "
            f"{padded_len} tokens long: lower it or check that the targets carry the prefix"
        )
    abs_lens = torch.round(rel_lens * padded_len) - num_tokens
    return tokens[:, num_tokens:], abs_lens.clamp(min=0) / (padded_len - num_tokens)


def joint_ctc_attention_loss(
    ctc_log_probs,
    seq_log_probs,
    wav_lens,
    tokens,
    tokens_lens,
    tokens_eos,
    tokens_eos_lens,
    dec_weight=0.7,
    label_smoothing=0.1,
    ignore_prefix_tokens=0,
    inter_ctc_log_probs=(),
    inter_ctc_weight=0.0,
    loss_reduction="token",
):
    """Weighted sum of CTC on the encoder and label-smoothed NLL on the decoder.

    Arguments
    ---------
    ctc_log_probs : torch.Tensor
        [batch, frames, vocab] log-probabilities of the CTC head (blank = 0).
    seq_log_probs : torch.Tensor
        [batch, target_len + 1, vocab] decoder log-probabilities, fed with ``tokens_bos``.
    wav_lens : torch.Tensor
        Relative lengths of the encoder frames [batch].
    tokens, tokens_lens : torch.Tensor
        CTC targets (no bos/eos, padded with 0) and their relative lengths.
    tokens_eos, tokens_eos_lens : torch.Tensor
        Decoder targets (``tokens + [eos]``) and their relative lengths.
    dec_weight : float
        Share of the decoder (NLL) term in [0, 1]; CTC weighs ``1 - dec_weight``
        (SpeechUT's ``ctc_ce`` criterion names it the same way). 0 trains CTC only.
    label_smoothing : float
        Probability mass spread uniformly over the vocabulary in the NLL term.
    ignore_prefix_tokens : int
        Leading target tokens (e.g. a language tag) that neither term is trained to predict;
        the decoder still receives them as input.
    inter_ctc_log_probs : sequence of torch.Tensor
        CTC log-probabilities of intermediate encoder layers (``EncoderDecoderOutput.inter_ctc_log_probs``).
    inter_ctc_weight : float
        Their mean CTC's share of the CTC term, in [0, 1); needs ``inter_ctc_log_probs`` when above 0.
    loss_reduction : str
        ``token`` or ``utterance``: how the batch's utterances add up in ``loss`` (module docstring).

    Returns
    -------
    dict
        ``loss`` (the weighted sum, to back-propagate), and detached ``ctc_loss`` (last layer),
        ``nll_loss``, ``accuracy`` (decoder token accuracy in [0, 1]) and, with intermediate CTC,
        ``inter_ctc_loss`` for logging.
    """
    if not 0.0 <= dec_weight <= 1.0:
        raise ValueError(f"dec_weight={dec_weight} must lie in [0, 1] (0 = CTC only)")
    check_inter_ctc(inter_ctc_weight, len(inter_ctc_log_probs))
    check_reduction(loss_reduction)
    tokens, tokens_lens = drop_prefix(tokens, tokens_lens, ignore_prefix_tokens)
    tokens_eos, _ = drop_prefix(tokens_eos, tokens_eos_lens, ignore_prefix_tokens)
    seq_log_probs, tokens_eos_lens = drop_prefix(
        seq_log_probs, tokens_eos_lens, ignore_prefix_tokens
    )
    ctc, ctc_figure = reduced_ctc(ctc_log_probs, tokens, wav_lens, tokens_lens, loss_reduction)
    decoder = sequence_loss(seq_log_probs, tokens_eos, tokens_eos_lens, label_smoothing, loss_reduction)
    figures = {"ctc_loss": ctc_figure.detach(), "nll_loss": decoder["per_token"].detach(),
               "accuracy": decoder["accuracy"]}
    if inter_ctc_weight > 0.0:
        inter = [reduced_ctc(log_probs, tokens, wav_lens, tokens_lens, loss_reduction)
                 for log_probs in inter_ctc_log_probs]
        ctc = (1.0 - inter_ctc_weight) * ctc + inter_ctc_weight * torch.stack([loss for loss, _ in inter]).mean()
        figures["inter_ctc_loss"] = torch.stack([figure for _, figure in inter]).mean().detach()
    return {"loss": (1.0 - dec_weight) * ctc + dec_weight * decoder["loss"], **figures}


def check_inter_ctc(inter_ctc_weight, num_layers):
    """Raises ValueError unless ``inter_ctc_weight`` in [0, 1) comes with intermediate layers (and back)."""
    if not 0.0 <= inter_ctc_weight < 1.0:
        raise ValueError(f"inter_ctc_weight={inter_ctc_weight} must lie in [0, 1) (0: no intermediate CTC)")
    if (inter_ctc_weight > 0.0) != (num_layers > 0):
        raise ValueError(f"inter_ctc_weight={inter_ctc_weight} with {num_layers} inter_ctc_layers: set both "
                         "(e.g. --inter_ctc_layers=[2] --inter_ctc_weight=0.3) or neither")


def sequence_loss(seq_log_probs, tokens_eos, tokens_eos_lens, label_smoothing=0.1, loss_reduction="token"):
    """Label-smoothed NLL of a teacher-forced decoder and its token accuracy.

    Arguments
    ---------
    seq_log_probs : torch.Tensor
        [batch, target_len, vocab] decoder log-probabilities (fed with ``tokens_bos``).
    tokens_eos, tokens_eos_lens : torch.Tensor
        Targets (``tokens + [eos]``, padded with 0) and their relative lengths.
    label_smoothing : float
        Probability mass spread uniformly over the vocabulary.
    loss_reduction : str
        ``token`` (the mean over every target token of the batch) or ``utterance`` (each utterance's
        sum, averaged over the batch).

    Returns
    -------
    dict
        ``loss`` (to back-propagate), ``per_token`` (the token mean, for logging) and ``accuracy``
        (float in [0, 1]).
    """
    check_reduction(loss_reduction)
    per_utterance = nll_loss(seq_log_probs, tokens_eos, tokens_eos_lens, label_smoothing=label_smoothing,
                             reduction="batch")
    sums = per_utterance * token_counts(tokens_eos_lens, tokens_eos.shape[1])
    per_token = sums.sum() / token_counts(tokens_eos_lens, tokens_eos.shape[1]).sum()
    correct, total = Accuracy(seq_log_probs, tokens_eos, tokens_eos_lens)
    loss = per_token if loss_reduction == "token" else sums.mean()
    return {"loss": loss, "per_token": per_token, "accuracy": float(correct) / max(float(total), 1.0)}


def masked_unit_loss(unit_logits, units, frame_mask, unmasked_weight=0.0, voiced=None):
    """HuBERT's masked prediction: cross-entropy against units on masked frames (+ unmasked ones).

    Arguments
    ---------
    unit_logits : torch.Tensor
        [batch, frames, n_units] unit-head logits.
    units : torch.LongTensor
        [batch, frames] target unit per frame; -1 on frames without a unit (padding).
    frame_mask : torch.BoolTensor
        [batch, frames], True where the encoder input was masked.
    unmasked_weight : float
        Weight of the unmasked frames' mean cross-entropy (HuBERT: 0, the masked-only loss).
    voiced : torch.BoolTensor, optional
        [batch, frames], True on frames that are not silence: adds ``masked_voiced_accuracy``, the
        masked accuracy on those frames alone (silence units are easy and inflate the plain figure).

    Returns
    -------
    dict
        ``loss`` = masked CE + ``unmasked_weight`` x unmasked CE (means over frames), and detached
        ``masked_loss``, ``unmasked_loss``, ``masked_accuracy``, ``unmasked_accuracy`` (and
        ``masked_voiced_accuracy``) for logging.
    """
    if unit_logits.shape[:2] != units.shape:
        raise ValueError(f"unit logits of {tuple(unit_logits.shape[:2])} frames but units of "
                         f"{tuple(units.shape)}: resample the units to the encoder frames first")
    cross_entropy = torch.nn.functional.cross_entropy(
        unit_logits.transpose(1, 2).float(), units.clamp(min=0), reduction="none")
    correct = unit_logits.argmax(-1) == units
    valid = units >= 0
    result = {}
    for name, frames in (("masked", valid & frame_mask), ("unmasked", valid & ~frame_mask)):
        count = frames.sum().clamp(min=1)
        result[f"{name}_loss"] = (cross_entropy * frames).sum() / count
        result[f"{name}_accuracy"] = float((correct & frames).sum()) / float(count)
    if voiced is not None:
        frames = valid & frame_mask & voiced.to(valid.device)
        result["masked_voiced_accuracy"] = float((correct & frames).sum()) / float(frames.sum().clamp(min=1))
    result["loss"] = result["masked_loss"] + unmasked_weight * result["unmasked_loss"]
    result["masked_loss"], result["unmasked_loss"] = (result["masked_loss"].detach(),
                                                      result["unmasked_loss"].detach())
    return result
