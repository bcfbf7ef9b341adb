"""ONNX export of a finetuned ``SpeechEncoderDecoder`` for onnxruntime (recipes/finetune/onnx_transcribe.py).

The exported encoder starts after the Fbank's STFT: it takes the power spectrum [1, frames, n_fft / 2 + 1]
and holds the mel filterbank, the log, the feature normalization, the conv front-end, the conformer and
the CTC head; the decoder graph scores token sequences against its states (attention rescoring of a CTC
n-best, onnx_transcribe.py --beam). The STFT itself stays outside (onnx_transcribe.py computes it with
numpy's FFT, with the window written in ``onnx_config.json``): ONNX's STFT operator is not one the legacy
exporter writes.
A model that streams (``common.streaming.check_streamable``) also gets two streaming graphs:
``stream_front_end.onnx`` (a window's power spectrum → front-end frames, with the causal statistics' sums
as inputs) and ``stream_encoder.onnx`` (one chunk through the conformer, every layer's attention and
convolution context as inputs and outputs), which onnx_transcribe.py --stream drives as
``common.streaming.StreamingRecognizer`` drives the torch model.
``onnx_config.json`` also carries the token pieces (text without SentencePiece) and the longest piece
the model decodes (``max_duration``)::

    export_onnx(model, tokenizer.processor, "exported/demo_asr", max_duration=10.0,
                decoding={"beam_size": 8, "ctc_weight": 0.4, "length_normalization": True, "prefix_ids": []})
"""

import json
import logging
import os
import warnings

import torch
from speechbrain.lobes.models.transformer.Conformer import ConformerEncoderLayerStreamingContext
from speechbrain.processing.features import spectral_magnitude
from speechbrain.utils.filter_analysis import stack_filter_properties

from common.atomic import atomic_path, atomic_write_text
from common.streaming import check_streamable
from common.tokens import BLANK, BOS, EOS

ENCODER_FILE, DECODER_FILE, CONFIG_FILE = "encoder.onnx", "decoder.onnx", "onnx_config.json"  # onnx_transcribe.py's
FRONT_END_FILE, STEP_FILE = "stream_front_end.onnx", "stream_encoder.onnx"  # streaming (onnx_transcribe.py --stream)
OPSET = 17
logger = logging.getLogger(__name__)


class SpectrumEncoder(torch.nn.Module):
    """Power spectrum [batch, frames, n_fft / 2 + 1] → (CTC log-probabilities [batch, out frames, vocab],
    encoder states [batch, out frames, d_model]); unpadded input (one recording per call)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, power_spectrum):
        feats = self.model.compute_features.compute_fbanks(power_spectrum)
        feats = self.model.normalize(feats, torch.ones(feats.shape[0], device=feats.device))
        enc_states = self.model.transformer.encode(self.model.frontend(feats), None, pad_idx=BLANK)
        return self.model.ctc_log_probs(enc_states), enc_states


class TokenDecoder(torch.nn.Module):
    """(tokens [n, steps] starting with <s>, encoder states [n, frames, d_model]) → the attention decoder's
    log-probabilities of the next token at each step [n, steps, vocab]: what rescoring a CTC n-best needs
    (rows padded after their end are never read there)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens, enc_states):
        dec_states, _ = self.model.transformer.decode(tokens, enc_states)
        return torch.log_softmax(self.model.seq_lin(dec_states), dim=-1)


class StreamingFrontEndGraph(torch.nn.Module):
    """One window of audio's power spectrum [1, frames, n_fft / 2 + 1] → (front-end frames [1, out frames,
    channels, bins], raw log-mel frames [1, frames, n_mels]): what ``common.streaming.StreamingFrontEnd``
    computes from each window (onnx_transcribe.py keeps its bookkeeping in numpy). With causal statistics
    it also takes the window's first exact frame ``first`` and the sums ``count``, ``total``, ``squares``
    of the frames before it (float64), and the raw frames let the runtime carry those sums on."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, power_spectrum, first=None, count=None, total=None, squares=None):
        raw = self.model.compute_features.compute_fbanks(power_spectrum)
        if first is None:
            feats = self.model.normalize(raw, torch.ones(raw.shape[0], device=raw.device))
        else:
            feats = self.model.normalize.causal(raw, (count, total, squares), first=first)
        return self.model.frontend(feats), raw


class StreamingEncoderStep(torch.nn.Module):
    """One chunk through the conformer as SpeechBrain's ``encode_streaming`` runs it, the state as tensors:
    (front-end frames [1, chunk, channels, bins], each layer's attention context [layers, 1, c, d_model]
    and convolution context [layers, 1, k, d_model], both empty before the first chunk) → (CTC
    log-probabilities [1, chunk, vocab], encoder states [1, chunk, d_model], the attention inputs
    [layers, 1, c + chunk, d_model], of which the runtime keeps the last ``left_chunks * chunk`` frames
    as the next context, and the next convolution context). Each layer is SpeechBrain's
    ``ConformerEncoderLayer.forward_streaming`` given a context holding these tensors."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, frames, attention_context, conv_context):
        transformer = self.model.transformer
        src = transformer.custom_src_module(frames.flatten(start_dim=2))
        pos_embs = transformer.positional_encoding(torch.cat([attention_context[0], src], dim=1))
        attention_inputs, conv_contexts = [], []
        for i, layer in enumerate(transformer.encoder.layers):
            # a context size past any length keeps every attention input: the runtime trims them
            context = ConformerEncoderLayerStreamingContext(mha_left_context_size=2 ** 31,
                                                            mha_left_context=attention_context[i],
                                                            dcconv_left_context=conv_context[i])
            src, _ = layer.forward_streaming(src, context, pos_embs=pos_embs)
            attention_inputs.append(context.mha_left_context)
            conv_contexts.append(context.dcconv_left_context)
        enc_states = transformer.encoder.norm(src)
        return (self.model.ctc_log_probs(enc_states), enc_states, torch.stack(attention_inputs),
                torch.stack(conv_contexts))


def stft_power(model, wavs):
    """The power spectrum SpectrumEncoder takes, as the model's Fbank computes it from ``wavs``."""
    return spectral_magnitude(model.compute_features.compute_STFT(wavs))


def feature_settings(model, sample_rate):
    """The STFT of the model's Fbank as numbers (``onnx_config.json``'s ``features``); raises when the
    features are not a plain log-mel Fbank (deltas or context windows are not exported)."""
    fbank = model.compute_features
    if getattr(fbank, "deltas", True) or getattr(fbank, "context", True):
        raise ValueError(f"compute_features is {type(fbank).__name__} with deltas or context: the ONNX export "
                         "handles speechbrain.lobes.features.Fbank with deltas: False and context: False")
    stft = fbank.compute_STFT
    if not stft.center or stft.pad_mode != "constant" or stft.win_length != stft.n_fft:
        raise ValueError(f"the Fbank's STFT (center={stft.center}, pad_mode={stft.pad_mode}, win_length="
                         f"{stft.win_length}, n_fft={stft.n_fft}) is not the centred, zero-padded STFT the "
                         "ONNX runtime computes")
    return {"sample_rate": int(sample_rate), "n_fft": stft.n_fft, "hop_length": stft.hop_length,
            "window": [float(value) for value in stft.window]}


def token_table(processor):
    """What onnx_transcribe.py needs to turn ids into text without SentencePiece: every piece, the
    control ids (decoded to nothing), the unknown id, the CTC blank and the decoder's <s> and </s>."""
    size = processor.get_piece_size()
    return {"pieces": [processor.id_to_piece(i) for i in range(size)],
            "control_ids": [i for i in range(size) if processor.is_control(i)],
            "unk_id": processor.unk_id(), "blank_id": BLANK, "bos_id": BOS, "eos_id": EOS}


def export_encoder(model, path, sample_rate):
    """Write ``SpectrumEncoder(model)`` as ONNX to ``path`` (frames a dynamic axis)."""
    example = stft_power(model, torch.zeros(1, sample_rate))
    with atomic_path(path) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer warnings
        torch.onnx.export(SpectrumEncoder(model).eval(), (example,), tmp, dynamo=False, opset_version=OPSET,
                          input_names=["power_spectrum"], output_names=["ctc_log_probs", "enc_states"],
                          dynamic_axes={"power_spectrum": {1: "frames"}, "ctc_log_probs": {1: "enc_frames"},
                                        "enc_states": {1: "enc_frames"}})


def export_decoder(model, path):
    """Write ``TokenDecoder(model)`` as ONNX to ``path`` (hypotheses, steps and frames dynamic axes)."""
    d_model = model.seq_lin.w.in_features
    example = (torch.tensor([[1, 5, 6], [1, 7, 2]]), torch.zeros(2, 9, d_model))
    with atomic_path(path) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(TokenDecoder(model).eval(), example, tmp, dynamo=False, opset_version=OPSET,
                          input_names=["tokens", "enc_states"], output_names=["log_probs"],
                          dynamic_axes={"tokens": {0: "hypotheses", 1: "steps"},
                                        "enc_states": {0: "hypotheses", 1: "enc_frames"},
                                        "log_probs": {0: "hypotheses", 1: "steps"}})


def streaming_settings(model, sample_rate):
    """What onnx_transcribe.py --stream needs besides the graphs (``onnx_config.json``'s ``streaming``):
    front-end frame ``i`` covers samples ``i * stride ± radius``; the Fbank's hop and half window; whether
    the statistics are causal."""
    properties = stack_filter_properties([model.compute_features, model.frontend])
    stft = model.compute_features.compute_STFT
    return {"stride": properties.stride, "radius": (properties.window_size - 1) // 2, "hop": stft.hop_length,
            "half_window": stft.n_fft // 2, "causal": getattr(model.normalize, "kind", None) == "causal",
            "frame_ms": 1000.0 * properties.stride / sample_rate}


def export_streaming(model, front_end_path, step_path, sample_rate):
    """Write ``StreamingFrontEndGraph`` and ``StreamingEncoderStep`` of ``model`` (one that passes
    ``common.streaming.check_streamable``) as ONNX."""
    power = stft_power(model, torch.zeros(1, sample_rate))
    causal = streaming_settings(model, sample_rate)["causal"]
    n_mels = model.compute_features.compute_fbanks.n_mels
    front_end_inputs = (power,) + ((torch.tensor(3), torch.tensor(10.0, dtype=torch.float64),
                                    torch.zeros(n_mels, dtype=torch.float64), torch.ones(n_mels, dtype=torch.float64))
                                   if causal else ())
    front_end_names = ["power_spectrum"] + (["first", "count", "total", "squares"] if causal else [])
    frames, _ = StreamingFrontEndGraph(model)(*front_end_inputs)
    layers = model.transformer.encoder.layers
    d_model, padding = model.seq_lin.w.in_features, layers[0].convolution_module.padding
    step_inputs = (frames[:, :16], torch.zeros(len(layers), 1, 8, d_model),
                   torch.zeros(len(layers), 1, padding, d_model))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with atomic_path(front_end_path) as tmp:
            torch.onnx.export(StreamingFrontEndGraph(model).eval(), front_end_inputs, tmp, dynamo=False,
                              opset_version=OPSET, input_names=front_end_names, output_names=["frames", "fbank"],
                              dynamic_axes={"power_spectrum": {1: "stft_frames"}, "frames": {1: "frames"},
                                            "fbank": {1: "stft_frames"}})
        with atomic_path(step_path) as tmp:
            torch.onnx.export(StreamingEncoderStep(model).eval(), step_inputs, tmp, dynamo=False, opset_version=OPSET,
                              input_names=["frames", "attention_context", "conv_context"],
                              output_names=["ctc_log_probs", "enc_states", "attention_inputs", "next_conv_context"],
                              dynamic_axes={"frames": {1: "chunk"}, "attention_context": {2: "context"},
                                            "conv_context": {2: "conv_context"}, "ctc_log_probs": {1: "chunk"},
                                            "enc_states": {1: "chunk"}, "attention_inputs": {2: "inputs"},
                                            "next_conv_context": {2: "next_conv_context"}})


@torch.no_grad()
def export_onnx(model, processor, out_dir, max_duration, decoding, sample_rate=16000):
    """Write ``encoder.onnx``, ``decoder.onnx`` and ``onnx_config.json`` of ``model`` (eval mode, feature
    statistics loaded) and its tokenizer's ``processor`` into ``out_dir``; returns the files written.
    ``decoding``: the rescoring settings onnx_transcribe.py --beam uses (``beam_size``, ``ctc_weight``,
    ``length_normalization``, ``prefix_ids``)."""
    model.eval()
    config = {"features": feature_settings(model, sample_rate), "tokens": token_table(processor),
              "max_duration": float(max_duration), "decoding": decoding}
    paths = [os.path.join(out_dir, name) for name in (ENCODER_FILE, DECODER_FILE)]
    export_encoder(model, paths[0], sample_rate)
    export_decoder(model, paths[1])
    try:
        check_streamable(model, "onnx_transcribe.py --stream")
    except ValueError as reason:
        logger.info("no streaming graphs: %s", reason)
    else:
        paths += [os.path.join(out_dir, name) for name in (FRONT_END_FILE, STEP_FILE)]
        export_streaming(model, paths[-2], paths[-1], sample_rate)
        config["streaming"] = streaming_settings(model, sample_rate)
    paths.append(os.path.join(out_dir, CONFIG_FILE))
    atomic_write_text(paths[-1], json.dumps(config, ensure_ascii=False, indent=1) + "\n")
    return paths
