"""ONNX export of a finetuned ``SpeechEncoderDecoder`` for onnxruntime (recipes/finetune/onnx_transcribe.py).

The exported encoder starts after the Fbank's STFT: it takes the power spectrum [1, frames, n_fft / 2 + 1]
and holds the mel filterbank, the log, the feature normalization, the conv front-end, the conformer and
the CTC head; the decoder graph scores token sequences against its states (attention rescoring of a CTC
n-best, onnx_transcribe.py --beam). The STFT itself stays outside (onnx_transcribe.py computes it with
numpy's FFT, with the window written in ``onnx_config.json``): ONNX's STFT operator is not one the legacy
exporter writes.
``onnx_config.json`` also carries the token pieces (text without SentencePiece) and the longest piece
the model decodes (``max_duration``)::

    export_onnx(model, tokenizer.processor, "exported/demo_asr", max_duration=10.0,
                decoding={"beam_size": 8, "ctc_weight": 0.4, "length_normalization": True, "prefix_ids": []})
"""

import json
import os
import warnings

import torch
from speechbrain.processing.features import spectral_magnitude

from common.atomic import atomic_path, atomic_write_text
from common.tokens import BLANK, BOS, EOS

ENCODER_FILE, DECODER_FILE, CONFIG_FILE = "encoder.onnx", "decoder.onnx", "onnx_config.json"  # onnx_transcribe.py's
OPSET = 17


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


@torch.no_grad()
def export_onnx(model, processor, out_dir, max_duration, decoding, sample_rate=16000):
    """Write ``encoder.onnx``, ``decoder.onnx`` and ``onnx_config.json`` of ``model`` (eval mode, feature
    statistics loaded) and its tokenizer's ``processor`` into ``out_dir``; returns the files written.
    ``decoding``: the rescoring settings onnx_transcribe.py --beam uses (``beam_size``, ``ctc_weight``,
    ``length_normalization``, ``prefix_ids``)."""
    model.eval()
    config = {"features": feature_settings(model, sample_rate), "tokens": token_table(processor),
              "max_duration": float(max_duration), "decoding": decoding}
    paths = [os.path.join(out_dir, name) for name in (ENCODER_FILE, DECODER_FILE, CONFIG_FILE)]
    export_encoder(model, paths[0], sample_rate)
    export_decoder(model, paths[1])
    atomic_write_text(paths[2], json.dumps(config, ensure_ascii=False, indent=1) + "\n")
    return paths
