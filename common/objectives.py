"""Training objectives.

``joint_ctc_attention_loss`` is SpeechUT's ``ctc_ce`` criterion:
``loss = (1 - dec_weight) * CTC + dec_weight * label-smoothed NLL``, with the CTC and NLL
terms from SpeechBrain (``speechbrain.nnet.losses``; its CTC always uses ``zero_infinity``).
"""

import logging

import torch
from speechbrain.nnet.losses import ctc_loss, nll_loss
from speechbrain.utils.Accuracy import Accuracy

logger = logging.getLogger(__name__)

BLANK_INDEX = 0  # tokenizer contract: <blank> is id 0, also the padding index


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

    Returns
    -------
    dict
        ``loss`` (the weighted sum, to back-propagate), and detached ``ctc_loss``,
        ``nll_loss``, ``accuracy`` (decoder token accuracy in [0, 1]) for logging.
    """
    if not 0.0 <= dec_weight <= 1.0:
        raise ValueError(f"dec_weight={dec_weight} must lie in [0, 1] (0 = CTC only)")
    tokens, tokens_lens = drop_prefix(tokens, tokens_lens, ignore_prefix_tokens)
    tokens_eos, _ = drop_prefix(tokens_eos, tokens_eos_lens, ignore_prefix_tokens)
    seq_log_probs, tokens_eos_lens = drop_prefix(
        seq_log_probs, tokens_eos_lens, ignore_prefix_tokens
    )
    ctc = ctc_loss(ctc_log_probs, tokens, wav_lens, tokens_lens, BLANK_INDEX)
    nll = nll_loss(seq_log_probs, tokens_eos, tokens_eos_lens, label_smoothing=label_smoothing)
    correct, total = Accuracy(seq_log_probs, tokens_eos, tokens_eos_lens)
    return {
        "loss": (1.0 - dec_weight) * ctc + dec_weight * nll,
        "ctc_loss": ctc.detach(),
        "nll_loss": nll.detach(),
        "accuracy": float(correct) / max(float(total), 1.0),
    }
