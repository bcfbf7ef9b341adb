"""Decoding: greedy CTC, joint CTC / attention beam search, token ids → text.

Token ids follow the tokenizer contract: 0 <blank> (CTC blank, padding), 1 <s>, 2 </s>, 3 <unk>.

A train.py builds the searcher once (or in its yaml with
``!apply:common.decoding.build_beam_searcher``) and calls it per batch::

    searcher = build_beam_searcher(model, beam_size=10, ctc_weight=0.4)
    enc_states = model.encode(wavs, wav_lens)
    hyps = beam_search(searcher, enc_states, wav_lens)          # list of token id lists
    words = ids_to_text(tokenizer, hyps)                        # list of str
"""

import logging

import torch
from speechbrain.decoders.ctc import ctc_greedy_decode
from speechbrain.decoders.scorer import CTCScorer, LengthScorer, RNNLMScorer, ScorerBuilder, TransformerLMScorer
from speechbrain.decoders.seq2seq import S2STransformerBeamSearcher

from common.tokens import BLANK, BOS, EOS

logger = logging.getLogger(__name__)



def ctc_greedy(ctc_log_probs, wav_lens):
    """Best path per frame, repeats collapsed and blanks (id 0) dropped.

    Arguments
    ---------
    ctc_log_probs : torch.Tensor
        [batch, frames, vocab] (log-)probabilities.
    wav_lens : torch.Tensor
        Relative lengths [batch]; frames past them are ignored.

    Returns
    -------
    list of list of int
        One token id sequence per utterance.
    """
    return ctc_greedy_decode(ctc_log_probs, wav_lens, blank_id=BLANK)


class JointCTCAttentionSearcher(S2STransformerBeamSearcher):
    """``S2STransformerBeamSearcher`` that also works with ``ctc_weight = 1``.

    With the attention weight at 0, SpeechBrain 1.1.2 skips the decoder but keeps the
    previous step's scores as this step's base, so CTC scores pile up step after step and
    the search emits garbage. Each step starts from zeros here instead.

    ``prefix_tokens`` (e.g. a target-language tag) are fed to the decoder after ``<s>`` before the
    search starts and are not part of the hypotheses, as in training with ``ignore_prefix_tokens``.
    """

    def __init__(self, *args, prefix_tokens=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.prefix_tokens = [int(token) for token in prefix_tokens]
        if self.prefix_tokens:
            self.bos_index = self.prefix_tokens[-1]  # the first step's input: the last prefix token

    def reset_mem(self, batch_size, device):
        """Decoder input before the first step: ``<s>`` and all prefix tokens but the last."""
        if not self.prefix_tokens:
            return None
        start = torch.tensor([BOS] + self.prefix_tokens[:-1], device=device)
        return start.repeat(batch_size, 1)

    def _attn_weight_step(self, inp_tokens, memory, enc_states, enc_lens, attn, log_probs):
        """Decoder scores for this step, or zeros when the decoder's weight is 0."""
        if self.attn_weight > 0:
            return super()._attn_weight_step(
                inp_tokens, memory, enc_states, enc_lens, attn, log_probs
            )
        return torch.zeros_like(log_probs), memory, attn


def lm_scorer(lm):
    """``(scorer, weight name)`` of a language model for SpeechBrain's ``ScorerBuilder``: an RNNLM
    (a module returning ``(logits, hidden)``) carries its state, a TransformerLM rescores the prefix."""
    from speechbrain.lobes.models.RNNLM import RNNLM

    if isinstance(lm, RNNLM):
        return RNNLMScorer(language_model=lm), "rnnlm"
    return TransformerLMScorer(language_model=lm), "transformerlm"


def build_scorer(ctc_lin, vocab_size, ctc_weight, length_bonus, lm=None, lm_weight=0.0):
    """The SpeechBrain scorer adding CTC prefix scores, a per-token bonus and a language model's
    scores (shallow fusion); None if none of them is used."""
    scorers, weights = [], {}
    if ctc_weight > 0.0:
        scorers.append(CTCScorer(ctc_fc=ctc_lin, blank_index=BLANK, eos_index=EOS))
        weights["ctc"] = ctc_weight
    if lm is not None and lm_weight > 0.0:
        scorer, name = lm_scorer(lm)
        scorers.append(scorer)
        weights[name] = lm_weight
    if length_bonus != 0.0:
        scorers.append(LengthScorer(vocab_size=vocab_size))
        weights["length"] = length_bonus
    return ScorerBuilder(full_scorers=scorers, weights=weights) if scorers else None


def build_beam_searcher(
    model,
    beam_size=10,
    ctc_weight=0.4,
    length_normalization=True,
    length_bonus=0.0,
    max_decode_ratio=1.0,
    temperature=1.0,
    prefix_tokens=(),
    lm=None,
    lm_weight=0.0,
):
    """Batched joint CTC / attention beam search over a ``SpeechEncoderDecoder``.

    Scores are ``(1 - ctc_weight) * log p_attention + ctc_weight * log p_ctc_prefix``
    (+ ``lm_weight * log p_lm`` + ``length_bonus`` per token), summed over the hypothesis.

    Arguments
    ---------
    model : common.models.SpeechEncoderDecoder
        Provides ``transformer`` (decoder), ``seq_lin`` and ``ctc_lin``.
    beam_size : int
        Hypotheses kept per utterance.
    ctc_weight : float
        In [0, 1]: 0 = attention decoder only, 1 = CTC prefix search only.
    length_normalization : bool
        Rank finished hypotheses by score / length (counters the bias to short outputs).
    length_bonus : float
        Score added per emitted token (a length penalty when negative); SpeechBrain allows it
        only without ``length_normalization``.
    max_decode_ratio : float
        Longest hypothesis, in tokens per encoder frame (1.0 = one token per frame).
    temperature : float
        Softmax temperature of the attention decoder.
    prefix_tokens : list of int
        Token ids given to the decoder after ``<s>`` and never predicted (a target-language tag).
    lm : torch.nn.Module, optional
        A language model over the same tokens (``recipes/lm``; ``common.inference.load_language_model``).
    lm_weight : float
        Its weight in the score (shallow fusion); 0 leaves it out.

    Returns
    -------
    JointCTCAttentionSearcher
        Call it through ``beam_search``.
    """
    if not 0.0 <= ctc_weight <= 1.0:
        raise ValueError(f"ctc_weight={ctc_weight} must lie in [0, 1] (1 = CTC only)")
    if length_normalization and length_bonus != 0.0:
        raise ValueError(
            f"length_bonus={length_bonus} cannot be combined with length_normalization: "
            "set length_normalization: False to use a per-token bonus, or set length_bonus: 0.0"
        )
    vocab_size = model.seq_lin.w.out_features
    return JointCTCAttentionSearcher(
        modules=[model.transformer, model.seq_lin],
        bos_index=BOS,
        eos_index=EOS,
        min_decode_ratio=0.0,
        max_decode_ratio=max_decode_ratio,
        beam_size=beam_size,
        scorer=build_scorer(model.ctc_lin, vocab_size, ctc_weight, length_bonus, lm, lm_weight),
        using_eos_threshold=False,
        length_normalization=length_normalization,
        temperature=temperature,
        prefix_tokens=prefix_tokens,
    )


def beam_search(searcher, enc_states, wav_lens):
    """Runs ``searcher`` on a batch of encoder states [batch, frames, d_model] with relative
    lengths [batch]; returns one token id list per utterance (without bos / eos)."""
    hyps, _, _, _ = searcher(enc_states.detach(), wav_lens)
    return [list(map(int, hyp)) for hyp in hyps]


def ids_to_text(tokenizer, hyps):
    """Token id sequences → strings with a ``sentencepiece.SentencePieceProcessor``.

    Control ids (blank, bos, eos) decode to nothing; <unk> (3) decodes to " ⁇ ".
    """
    return [tokenizer.decode(hyp) for hyp in hyps]
