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
import torch.nn.functional as F
from speechbrain.dataio.dataio import length_to_mask
from speechbrain.decoders.ctc import ctc_greedy_decode
from speechbrain.decoders.scorer import CTCScorer, LengthScorer, RNNLMScorer, ScorerBuilder, TransformerLMScorer
from speechbrain.decoders.seq2seq import S2STransformerBeamSearcher
from speechbrain.decoders.utils import _update_mem

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
    """``S2STransformerBeamSearcher`` that also works with ``ctc_weight = 1`` and decodes each step
    incrementally.

    With the attention weight at 0, SpeechBrain 1.1.2 skips the decoder but keeps the
    previous step's scores as this step's base, so CTC scores pile up step after step and
    the search emits garbage. Each step starts from zeros here instead.

    SpeechBrain's step runs the decoder over the whole prefix and projects the encoder states to
    cross-attention keys and values again at every step: on a CPU that projection is most of a
    decoding's time. Here (``cached``, the default) the keys and values of the encoder states are
    projected once per batch, each layer keeps its self-attention inputs of the earlier positions, and
    a step runs only the new position: the same scores up to float rounding (a test compares them),
    several times faster (``bench/decoding_speed.py``).

    ``prefix_tokens`` (e.g. a target-language tag) are fed to the decoder after ``<s>`` before the
    search starts and are not part of the hypotheses, as in training with ``ignore_prefix_tokens``.
    """

    def __init__(self, *args, prefix_tokens=(), cached=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.prefix_tokens = [int(token) for token in prefix_tokens]
        if self.prefix_tokens:
            self.bos_index = self.prefix_tokens[-1]  # the first step's input: the last prefix token
        self.cached = cached and _cacheable(self.model)
        self._cross = None  # (encoder states, [(keys, values) per decoder layer])

    def reset_mem(self, batch_size, device):
        """Decoder input before the first step: ``<s>`` and all prefix tokens but the last."""
        if not self.prefix_tokens:
            return None
        start = torch.tensor([BOS] + self.prefix_tokens[:-1], device=device)
        return start.repeat(batch_size, 1)

    def permute_mem(self, memory, index):
        """Keep the surviving hypotheses' tokens (and their layers' cached inputs)."""
        if isinstance(memory, tuple):
            tokens, layer_inputs = memory
            return (tokens.index_select(0, index), [inputs.index_select(0, index) for inputs in layer_inputs])
        return super().permute_mem(memory, index)

    def forward_step(self, inp_tokens, memory, enc_states, enc_lens):
        """Log-probabilities of the next token; the memory is ``(tokens, per-layer inputs)``."""
        if not self.cached:
            return super().forward_step(inp_tokens, memory, enc_states, enc_lens)
        tokens, cache = memory if isinstance(memory, tuple) else (memory, None)
        tokens = _update_mem(inp_tokens, tokens)
        done = 0 if cache is None else cache[0].size(1)
        transformer = self.model
        embedded = transformer.custom_tgt_module(tokens)
        embedded = embedded + (transformer.positional_encoding_decoder(embedded)
                               if transformer.attention_type == "RelPosMHAXL"
                               else transformer.positional_encoding(embedded))
        x = embedded[:, done:]
        new = x.size(1)
        causal = None
        if new > 1:  # the prefix tokens at the first step: each sees itself and what precedes it
            above = torch.ones(new, done + new, dtype=torch.bool, device=x.device).triu(done + 1)
            causal = torch.zeros(above.shape, device=x.device).masked_fill(above, float("-inf"))
        keep = length_to_mask(enc_lens, max_len=enc_states.size(1)).bool()[:, None, None, :]
        layer_inputs = []
        for number, layer in enumerate(transformer.decoder.layers):
            before = layer.normalize_before
            h = layer.norm1(x) if before else x
            keys = h if cache is None else torch.cat([cache[number], h], dim=1)
            layer_inputs.append(keys)
            attended, _ = layer.self_attn(query=h, key=keys, value=keys, attn_mask=causal)
            x = x + attended if before else layer.norm1(x + attended)
            h = layer.norm2(x) if before else x
            attended = self._cross_attention(layer.multihead_attn.att, h, number, enc_states, keep)
            x = x + attended if before else layer.norm2(x + attended)
            h = layer.norm3(x) if before else x
            x = x + layer.pos_ffn(h) if before else layer.norm3(x + layer.pos_ffn(h))
        prediction = transformer.decoder.norm(x[:, -1:])
        log_probs = self.softmax(self.fc(prediction) / self.temperature)
        return log_probs[:, -1, :], (tokens, layer_inputs), None

    def _cross_attention(self, attention, queries, number, enc_states, keep):
        """``torch.nn.MultiheadAttention`` of ``queries`` over the encoder states, their keys and
        values projected once per batch."""
        if self._cross is None or self._cross[0] is not enc_states:
            self._cross = (enc_states, [None] * len(self.model.decoder.layers))
        heads, width = attention.num_heads, attention.embed_dim
        if self._cross[1][number] is None:
            weight, bias = attention.in_proj_weight, attention.in_proj_bias
            keys = F.linear(enc_states, weight[width:2 * width], bias[width:2 * width])
            values = F.linear(enc_states, weight[2 * width:], bias[2 * width:])
            self._cross[1][number] = tuple(t.unflatten(-1, (heads, -1)).transpose(1, 2) for t in (keys, values))
        keys, values = self._cross[1][number]
        q = F.linear(queries, attention.in_proj_weight[:width], attention.in_proj_bias[:width])
        q = q.unflatten(-1, (heads, -1)).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=keep)
        return attention.out_proj(out.transpose(1, 2).flatten(2))

    def _attn_weight_step(self, inp_tokens, memory, enc_states, enc_lens, attn, log_probs):
        """Decoder scores for this step, or zeros when the decoder's weight is 0."""
        if self.attn_weight > 0:
            return super()._attn_weight_step(
                inp_tokens, memory, enc_states, enc_lens, attn, log_probs
            )
        return torch.zeros_like(log_probs), memory, attn


def _cacheable(transformer):
    """Whether the incremental step knows this decoder: SpeechBrain's ``TransformerASR`` decoder of
    plain multi-head attention with packed projections, sine positions."""
    layers = getattr(getattr(transformer, "decoder", None), "layers", None)
    if not layers or transformer.attention_type not in ("RelPosMHAXL", "regularMHA"):
        return False
    if transformer.attention_type == "regularMHA" and transformer.positional_encoding_type != "fixed_abs_sine":
        return False
    attention = getattr(layers[0].multihead_attn, "att", None)
    return (isinstance(attention, torch.nn.MultiheadAttention) and attention._qkv_same_embed_dim
            and attention.in_proj_bias is not None and attention.bias_k is None)


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
