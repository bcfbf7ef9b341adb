"""Speech encoder-decoder: Fbank → normalization → conv front-end → Conformer → CTC / attention.

The graph is assembled from SpeechBrain lobes passed in by the yaml (see
``recipes/hparams/model/conformer.yaml``); this class only fixes how they connect and
the names under which their weights are saved. Those names are a contract shared by
pretraining and finetuning (weights move between them by name):

=====================  ============================================================
``compute_features``   ``speechbrain.lobes.features.Fbank`` (no weights)
``normalize``          ``speechbrain.processing.features.InputNormalization``: its
                       global mean/std are *not* in ``state_dict()``; list it in the
                       checkpointer on its own.
``augment``            optional feature augmentation (SpecAugment), training only
``frontend``           ``speechbrain.lobes.models.convolution.ConvolutionFrontEnd``
``transformer``        ``speechbrain.lobes.models.transformer.TransformerASR``:
                       ``transformer.custom_src_module`` (input projection),
                       ``transformer.encoder`` (Conformer), ``transformer.custom_tgt_module``
                       (token embedding), ``transformer.decoder`` (Transformer decoder)
``ctc_lin``            ``speechbrain.nnet.linear.Linear``: encoder states → CTC logits
``seq_lin``            ``speechbrain.nnet.linear.Linear``: decoder states → token logits
=====================  ============================================================

``inter_ctc_layers`` (intermediate CTC, Lee & Watanabe 2021, ESPnet's ``interctc_layer_idx``): the
outputs of these encoder layers (1-based) also go through the encoder's final norm and the same
``ctc_lin``, so the objective can ask the lower layers to be CTC-readable too; it adds no weights.

``dynchunktrain_config`` (``forward`` and ``encode``; SpeechBrain's ``DynChunkTrainConfig``) restricts each
encoder frame's attention and convolution to its chunk and the chunks before it (dynamic chunk training,
WeNet U2's: a recipe draws one per batch, ``speechbrain.utils.dynamic_chunk_training``), so that the same
model decodes streaming (common/streaming.py) and offline.

``parameter_group`` sorts the weights into four groups a recipe can give their own learning rate
(``lr_scales``): ``encoder`` (front-end, input projection, conformer), ``ctc`` (``ctc_lin``),
``cross_attention`` (each decoder layer's attention to the encoder and the norm before it) and
``language_model`` (token embedding, the rest of the decoder, ``seq_lin``: what a text-only pretraining
pass, ``text_task: lm``, trains).
"""

import contextlib
import logging
from typing import NamedTuple, Optional, Sequence

import torch

from common.tokens import BLANK

logger = logging.getLogger(__name__)



PARAMETER_GROUPS = {  # group -> parameter-name prefixes; cross-attention is told apart by its layer part
    "encoder": ("frontend.", "transformer.custom_src_module.", "transformer.encoder."),
    "ctc": ("ctc_lin.",),
    "language_model": ("transformer.custom_tgt_module.", "transformer.decoder.", "seq_lin."),
}
CROSS_ATTENTION_PARTS = (".multihead_attn.", ".norm2.")  # SpeechBrain's TransformerDecoderLayer names


def parameter_group(name):
    """The group (``PARAMETER_GROUPS`` or ``cross_attention``) of a ``SpeechEncoderDecoder`` parameter name
    (a DDP ``module.`` prefix is ignored); a name of no group raises, naming it."""
    name = name.removeprefix("module.")
    for group, prefixes in PARAMETER_GROUPS.items():
        if name.startswith(prefixes):
            if group == "language_model" and any(part in name for part in CROSS_ATTENTION_PARTS):
                return "cross_attention"
            return group
    raise ValueError(f"model parameter {name} is in no learning-rate group: add its prefix to "
                     "PARAMETER_GROUPS in common/models/encoder_decoder.py")


class EncoderDecoderOutput(NamedTuple):
    """What one forward pass returns; lengths stay relative (the front-end keeps ratios)."""

    ctc_log_probs: torch.Tensor  # [batch, frames, vocab]
    seq_log_probs: torch.Tensor  # [batch, target_len, vocab]
    enc_states: torch.Tensor  # [batch, frames, d_model]
    inter_ctc_log_probs: tuple = ()  # one [batch, frames, vocab] per ``inter_ctc_layers`` entry


class SpeechEncoderDecoder(torch.nn.Module):
    """Joint CTC / attention speech model built from SpeechBrain lobes.

    Arguments
    ---------
    compute_features : torch.nn.Module
        Waveform [batch, samples] (16 kHz) → features [batch, frames, n_mels].
    normalize : torch.nn.Module
        ``InputNormalization``; called with relative lengths and the epoch.
    frontend : torch.nn.Module
        Convolutional front-end, features → [batch, frames / stride, channels, n_mels / stride].
    transformer : TransformerASR
        Encoder, decoder, projections and token embedding.
    ctc_lin, seq_lin : torch.nn.Module
        Output heads producing logits over the vocabulary.
    augment : torch.nn.Module, optional
        Feature augmentation ``(feats, rel_lens) -> (feats, rel_lens)`` applied in training
        mode only; it must keep the batch size (no ``concat_original``).
    inter_ctc_layers : sequence of int
        Encoder layers (1-based, below the last) whose normed outputs ``forward`` also scores with
        ``ctc_lin`` (``inter_ctc_log_probs``: intermediate CTC). Empty: none.

    Example
    -------
    >>> from hyperpyyaml import load_hyperpyyaml
    >>> graph = load_hyperpyyaml(open("recipes/hparams/model/conformer.yaml"),
    ...                          {"vocab_size": 20, "d_model": 32, "d_ffn": 64})  # doctest: +SKIP
    >>> out = graph["model"](wavs, wav_lens, tokens_bos)  # doctest: +SKIP
    """

    def __init__(self, compute_features, normalize, frontend, transformer, ctc_lin, seq_lin,
                 augment: Optional[torch.nn.Module] = None, inter_ctc_layers: Sequence[int] = ()):
        super().__init__()
        self.compute_features = compute_features
        self.normalize = normalize
        self.augment = augment
        self.frontend = frontend
        self.transformer = transformer
        self.ctc_lin = ctc_lin
        self.seq_lin = seq_lin
        self.inter_ctc_layers = tuple(inter_ctc_layers)
        self._check_frontend_matches_transformer()
        self._check_inter_ctc_layers()

    def _check_frontend_matches_transformer(self):
        """Fail at build time, not mid-training, when the projection size is inconsistent."""
        with torch.no_grad():
            feats = self.compute_features(torch.zeros(1, 16000))
            frontend_out = self.frontend(feats)
        produced = frontend_out.shape[2] * frontend_out.shape[3]
        expected = self.transformer.custom_src_module.layers[0].w.in_features
        if produced != expected:
            raise ValueError(
                f"the conv front-end outputs {frontend_out.shape[2]} channels x "
                f"{frontend_out.shape[3]} mel bins = {produced} values per frame, but the "
                f"transformer's input_size is {expected}: n_mels must be divisible by the "
                f"front-end's total stride, and input_size = n_mels / stride * out_channels"
            )

    def _check_inter_ctc_layers(self):
        """Each intermediate CTC layer must be an encoder layer below the last (which CTC reads anyway)."""
        depth = len(self.transformer.encoder.layers)
        wrong = [layer for layer in self.inter_ctc_layers if not (isinstance(layer, int) and 1 <= layer < depth)]
        if wrong:
            raise ValueError(f"inter_ctc_layers={list(self.inter_ctc_layers)}: {wrong} not an encoder layer "
                             f"1-{depth - 1} (1-based; the last, {depth}, feeds the CTC head already), "
                             f"e.g. [{max(1, depth // 2)}]")

    @contextlib.contextmanager
    def _encoder_layer_outputs(self):
        """Inside the block, ``captured[layer]`` is the output of each ``inter_ctc_layers`` layer."""
        captured, layers = {}, self.transformer.encoder.layers
        handles = [layers[layer - 1].register_forward_hook(
                       lambda module, args, output, layer=layer: captured.__setitem__(layer, output[0]))
                   for layer in self.inter_ctc_layers]
        try:
            yield captured
        finally:
            for handle in handles:
                handle.remove()

    def frames_per_second(self):
        """Encoder frames per second of audio (the front-end's output rate), measured on 10 s."""
        with torch.no_grad():
            frames = self.frontend(self.compute_features(torch.zeros(1, 160000))).shape[1]
        return frames / 10.0

    def extract_features(self, wavs, wav_lens, epoch=None):
        """Fbank + normalization (+ augmentation in training): [batch, frames, n_mels].

        ``wavs`` are waveforms [batch, samples], or Fbank features [batch, frames, n_mels] that the
        loader workers computed already (``fbank_in_loader``): then only normalization and
        augmentation run here.
        """
        feats = self.compute_features(wavs) if wavs.dim() == 2 else wavs
        feats = self.normalize(feats, wav_lens, epoch=epoch)
        if self.training and self.augment is not None:
            augmented, _ = self.augment(feats, wav_lens)
            if augmented.shape[0] != feats.shape[0]:
                raise ValueError(
                    f"augment turned a batch of {feats.shape[0]} into {augmented.shape[0]}: "
                    "set concat_original: False and repeat_augment: 1 in the Augmenter"
                )
            feats = augmented
        return feats

    def encode(self, wavs, wav_lens, epoch=None, dynchunktrain_config=None):
        """Waveforms [batch, samples] at 16 kHz → encoder states [batch, frames, d_model] (each frame seeing
        only its chunk and those before it under a ``dynchunktrain_config``)."""
        src = self.frontend(self.extract_features(wavs, wav_lens, epoch))
        return self.transformer.encode(src, wav_lens, pad_idx=BLANK, dynchunktrain_config=dynchunktrain_config)

    def ctc_log_probs(self, enc_states):
        """Encoder states → CTC log-probabilities [batch, frames, vocab]."""
        return torch.log_softmax(self.ctc_lin(enc_states), dim=-1)

    def forward(self, wavs, wav_lens, tokens_bos, epoch=None, dynchunktrain_config=None) -> EncoderDecoderOutput:
        """Teacher-forced pass: both heads' log-probs given ``tokens_bos`` ([bos] + tokens); the encoder
        chunked as ``dynchunktrain_config`` says (None: full context)."""
        src = self.frontend(self.extract_features(wavs, wav_lens, epoch))
        with self._encoder_layer_outputs() as captured:
            if dynchunktrain_config is None:
                enc_states, dec_states = self.transformer(src, tokens_bos, wav_lens, pad_idx=BLANK)
            else:  # SpeechBrain's TransformerASR.forward takes no chunk configuration: encode, then decode
                enc_states = self.transformer.encode(src, wav_lens, BLANK, dynchunktrain_config=dynchunktrain_config)
                enc_lens = torch.round(wav_lens * enc_states.shape[1]).long()
                dec_states, _ = self.transformer.decode(tokens_bos, enc_states, enc_lens)
        seq_log_probs = torch.log_softmax(self.seq_lin(dec_states), dim=-1)
        inter = tuple(self.ctc_log_probs(self.transformer.encoder.norm(captured[layer]))
                      for layer in self.inter_ctc_layers)
        return EncoderDecoderOutput(self.ctc_log_probs(enc_states), seq_log_probs, enc_states, inter)
