#!/usr/bin/env python3
"""Export a trained finetune experiment as a SpeechBrain pretrained-model folder.

    python recipes/finetune/export.py exp/finetune_demo exported/demo_asr

OUT_DIR then holds ``hyperparams.yaml`` (the model graph of the experiment's config with SpeechBrain's
inference modules: encoder, joint CTC/attention beam searcher, tokenizer, pretrainer), the averaged
weights (``asr.ckpt``), the feature statistics (``normalizer.ckpt``), the tokenizer (``tokenizer.ckpt``),
the language model when the experiment decodes with one (``lm.ckpt``, ``--lm_dir`` / ``--lm_weight``)
and a README.md. It loads without Tandem::

    from speechbrain.inference.ASR import EncoderDecoderASR
    asr = EncoderDecoderASR.from_hparams(source="exported/demo_asr", savedir="pretrained/demo_asr")
    asr.transcribe_file("recording.wav")

and decodes as ``recipes/finetune/transcribe.py`` does (same search, beam and CTC weight). Two cases
need Tandem importable, because plain SpeechBrain cannot express them: a target-language prefix
(``prefix_tokens``, speech translation) and ``ctc_weight: 1.0`` (see common.decoding).

``EncoderDecoderASR`` reads files with SpeechBrain's resampler and without the Opus pass the training
audio went through. ``custom.py`` (written beside) holds ``TandemASR``, the same model reading audio as
``transcribe.py`` does (channels averaged, SciPy's ``resample_poly``, the shards' Opus codec), so that
its hypotheses equal ``transcribe.py``'s at every sample rate::

    from speechbrain.inference.interfaces import foreign_class
    asr = foreign_class(source="exported/demo_asr", pymodule_file="custom.py", classname="TandemASR",
                        savedir="pretrained/demo_asr")

``--onnx`` also writes ``encoder.onnx``, ``decoder.onnx`` and ``onnx_config.json`` (common/onnx_export.py) for
``recipes/finetune/onnx_transcribe.py``, which needs numpy, soundfile and onnxruntime only; for a model that
streams, ``stream_front_end.onnx`` and ``stream_encoder.onnx`` too (``onnx_transcribe.py --stream``).
"""

import argparse
import inspect
import logging
import os
import re
import shutil
import sys

import torch

from common import audio_io
from common.atomic import atomic_path, atomic_write_text
from common.data import Tokenizer, vocab_size
from common.inference import averaged_checkpoint, decoding_settings, load_language_model, load_trained
from common.models.experiment import graph_yaml, read_config_tree
from common.onnx_export import export_onnx
from common.tokens import BLANK, BOS, EOS
from common.user_errors import UserValueError, run_command

logger = logging.getLogger("export")

# The graph's modules with a state (weights, filterbank buffers), named as SpeechEncoderDecoder saves them.
WEIGHT_MODULES = ("compute_features", "frontend", "transformer", "ctc_lin", "seq_lin")
# Training-only parts of the graph left out of the exported config (and Tandem's own model class).
TRAINING_ONLY = ("model", "augment", "time_warp", "time_drop", "freq_drop")
PLAIN_SEARCHER = "speechbrain.decoders.seq2seq.S2STransformerBeamSearcher"
TANDEM_SEARCHER = "common.decoding.JointCTCAttentionSearcher"

INFERENCE_YAML = """
# ---- Inference (recipes/finetune/export.py) ----
tokenizer: !new:sentencepiece.SentencePieceProcessor

encoder: !new:speechbrain.nnet.containers.LengthsCapableSequential
    compute_features: !ref <compute_features>
    normalize: !ref <normalize>
    frontend: !ref <frontend>
    transformer_encoder: !new:speechbrain.lobes.models.transformer.TransformerASR.EncoderWrapper
        transformer: !ref <transformer>
{scorer}
decoder: !new:{searcher}
    modules: [!ref <transformer>, !ref <seq_lin>]
    bos_index: {bos}
    eos_index: {eos}
    min_decode_ratio: 0.0
    max_decode_ratio: {max_decode_ratio}
    beam_size: {beam_size}
    using_eos_threshold: False
    length_normalization: {length_normalization}
    temperature: 1.0{scorer_ref}{prefix}

modules:
    encoder: !ref <encoder>
    decoder: !ref <decoder>

asr_model: !new:torch.nn.ModuleDict
    modules:
{weight_modules}

pretrainer: !new:speechbrain.utils.parameter_transfer.Pretrainer
    loadables:
        asr: !ref <asr_model>
        normalizer: !ref <normalize>
        tokenizer: !ref <tokenizer>
{lm_loadable}"""

CUSTOM_MODULE = "custom.py"
CUSTOM_HEADER = '''"""The exported model reading audio as it was trained (written by recipes/finetune/export.py).

    from speechbrain.inference.interfaces import foreign_class
    asr = foreign_class(source=MODEL_DIR, pymodule_file="custom.py", classname="TandemASR")
    asr.transcribe_file("recording.wav")

The functions below are Tandem's common/audio_io.py, copied by the export.
"""

import io
import math

import numpy as np
import scipy.signal
import soundfile as sf
import torch
from speechbrain.inference.ASR import EncoderDecoderASR

'''
CUSTOM_CLASS = '''

class TandemASR(EncoderDecoderASR):
    """``EncoderDecoderASR`` whose files are read as the training audio was: channels averaged, resampled
    with ``scipy.signal.resample_poly``, coded and decoded with the shards' Opus codec."""

    def load_audio(self, path, savedir=None):
        samples, rate = sf.read(str(path), dtype="float32", always_2d=True)
        mono = to_mono_rate(samples, rate, SAMPLE_RATE)
        return torch.from_numpy(decode_opus(encode_opus(mono))[0]).to(self.device)
'''

README = """# {name}: speech recognition exported from a Tandem experiment

Exported by `recipes/finetune/export.py {exp_dir}`. Load it with SpeechBrain alone:

```python
from speechbrain.inference.ASR import EncoderDecoderASR
asr = EncoderDecoderASR.from_hparams(source="{out_dir}", savedir="pretrained_models/{name}")
print(asr.transcribe_file("recording.wav"))
```

`EncoderDecoderASR` reads files with SpeechBrain's resampler and without the Opus codec the training
audio went through; `custom.py` reads them as training did (its hypotheses equal `transcribe.py`'s):

```python
from speechbrain.inference.interfaces import foreign_class
asr = foreign_class(source="{out_dir}", pymodule_file="custom.py", classname="TandemASR",
                    savedir="pretrained_models/{name}")
```
{onnx}
Search: joint CTC/attention beam search, beam {beam_size}, CTC weight {ctc_weight}, language model
{lm}.
Test results of the experiment (its results.txt):

{results}
"""


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exp_dir", help="a finetune experiment folder (hyperparams.yaml, averaged.ckpt)")
    parser.add_argument("out_dir", help="the folder to write (created; files in it are replaced)")
    parser.add_argument("--tokenizer", default=None, help="the tokenizer, when not at the config's tokenizer_file")
    parser.add_argument("--lm_dir", default=None, help="a recipes/lm experiment to fuse (default: the config's)")
    parser.add_argument("--lm_weight", type=float, default=None, help="its weight (default: the config's)")
    parser.add_argument("--onnx", action="store_true", help="also write encoder.onnx and onnx_config.json for "
                        "recipes/finetune/onnx_transcribe.py (numpy, soundfile and onnxruntime only)")
    return parser.parse_args(argv)


def scorer_yaml(settings, lm_class=None):
    """The scorer block of the searcher: CTC prefix scores, the language model (``lm_class``: its
    class name, RNNLM or TransformerLM) and a per-token bonus, as ``common.decoding.build_scorer``
    builds them; empty when none is used."""
    scorers, weights = [], []
    if settings["ctc_weight"] > 0.0:
        scorers.append("!new:speechbrain.decoders.scorer.CTCScorer\n"
                       f"            ctc_fc: !ref <ctc_lin>\n            blank_index: {BLANK}\n"
                       f"            eos_index: {EOS}")
        weights.append(f"ctc: {settings['ctc_weight']}")
    if lm_class is not None:
        scorers.append(f"!new:speechbrain.decoders.scorer.{lm_class}Scorer\n"
                       "            language_model: !ref <lm_model>")
        weights.append(f"{lm_class.lower()}: {settings['lm_weight']}")
    if settings["length_bonus"] != 0.0:
        scorers.append("!new:speechbrain.decoders.scorer.LengthScorer\n"
                       "            vocab_size: !ref <vocab_size>")
        weights.append(f"length: {settings['length_bonus']}")
    if not scorers:
        return ""
    listed = "".join(f"\n        - {scorer}" for scorer in scorers)
    return (f"\nscorer: !new:speechbrain.decoders.scorer.ScorerBuilder\n    full_scorers:{listed}\n"
            f"    weights: {{{', '.join(weights)}}}\n")


def inference_yaml(settings, lm_class=None):
    """The inference part of the exported hyperparams.yaml for the config's decoding ``settings``
    (and its language model, of class ``lm_class``, when it has one)."""
    needs_tandem = bool(settings["prefix_tokens"]) or settings["ctc_weight"] >= 1.0
    scorer = scorer_yaml(settings, lm_class)
    prefix = ""
    if settings["prefix_tokens"]:
        prefix = "\n    prefix_tokens: " + str(settings["prefix_ids"])
    return INFERENCE_YAML.format(
        scorer=scorer, searcher=TANDEM_SEARCHER if needs_tandem else PLAIN_SEARCHER, bos=BOS, eos=EOS,
        max_decode_ratio=settings["max_decode_ratio"], beam_size=settings["beam_size"],
        length_normalization=settings["length_normalization"],
        scorer_ref="\n    scorer: !ref <scorer>" if scorer else "", prefix=prefix,
        weight_modules="".join(f"        {name}: !ref <{name}>\n" for name in WEIGHT_MODULES),
        lm_loadable="        lm: !ref <lm_model>\n" if lm_class else "")


def weights(state):
    """The averaged model's parameters under the exported ModuleDict's names (no-weight modules out)."""
    kept = {key: value for key, value in state.items() if key.split(".")[0] in WEIGHT_MODULES}
    unknown = sorted({key.split(".")[0] for key in state} - set(WEIGHT_MODULES))
    if unknown:
        raise ValueError(f"the averaged model has weights under {unknown}, which the exported graph "
                         f"lacks: add them to WEIGHT_MODULES and the encoder in {__file__}")
    return kept


def save_torch(obj, path):
    """torch.save through a temporary file, so a killed export never leaves half a checkpoint."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def export(exp_dir, out_dir, tokenizer_file=None, onnx=False, **overrides):
    """Write the SpeechBrain model folder ``out_dir`` of experiment ``exp_dir`` (with the ONNX files when
    ``onnx``); returns its path. ``overrides`` (``lm_dir``, ``lm_weight``) replace the config's decoding
    settings."""
    tree = read_config_tree(exp_dir)
    tokenizer_file = tokenizer_file or tree["tokenizer_file"]
    num_tokens = vocab_size(tokenizer_file)
    settings = {**decoding_settings(tree), **overrides}
    settings["prefix_ids"] = [Tokenizer(tokenizer_file).piece_id(token) for token in settings["prefix_tokens"]]
    graph = speechbrain_graph(graph_yaml(tree, num_tokens, drop=TRAINING_ONLY))
    if graph is None and not onnx:
        raise UserValueError(f"{exp_dir} normalizes features with normalize_type: frame, which SpeechBrain's "
                             "EncoderDecoderASR cannot: export it with --onnx (onnx_transcribe.py)")
    os.makedirs(out_dir, exist_ok=True)
    if graph is None:
        logger.warning("normalize_type: frame: only the ONNX files are written (SpeechBrain's EncoderDecoderASR "
                       "has no frame-level normalization)")
    else:
        write_speechbrain_folder(exp_dir, out_dir, tokenizer_file, num_tokens, graph, settings)
    if onnx:
        trained = load_trained(exp_dir, "cpu", tokenizer_file)
        decoding = {key: settings[key] for key in ("beam_size", "ctc_weight", "length_normalization", "prefix_ids")}
        export_onnx(trained.model, trained.tokenizer.processor, out_dir, settings["max_duration"], decoding)
    atomic_write_text(os.path.join(out_dir, "README.md"), readme(exp_dir, out_dir, settings, onnx))
    return out_dir


def speechbrain_graph(text):
    """The model graph's YAML with SpeechBrain's classes only (the feature normalizer is Tandem's
    ``Normalization``, SpeechBrain's own for ``global`` and ``sentence``); None for ``frame``, which
    SpeechBrain has no module for."""
    if re.search(r"norm_type:\s*frame\b", text):
        return None
    return text.replace("!new:common.models.normalization.Normalization",
                        "!new:speechbrain.processing.features.InputNormalization")


def write_speechbrain_folder(exp_dir, out_dir, tokenizer_file, num_tokens, graph, settings):
    """hyperparams.yaml, the checkpoints, the tokenizer (and LM) and custom.py of the SpeechBrain export."""
    state = torch.load(averaged_checkpoint(exp_dir), map_location="cpu")
    header = (f"# A Tandem finetune experiment ({os.path.basename(os.path.abspath(exp_dir))}) for "
              "speechbrain.inference.ASR.EncoderDecoderASR (recipes/finetune/export.py).\n")
    lm_yaml, lm_class = write_language_model(settings, tokenizer_file, num_tokens, out_dir)
    config = header + graph + lm_yaml + inference_yaml(settings, lm_class)
    atomic_write_text(os.path.join(out_dir, "hyperparams.yaml"), config)
    save_torch(weights(state["model"]), os.path.join(out_dir, "asr.ckpt"))
    save_torch(state.get("normalize") or {}, os.path.join(out_dir, "normalizer.ckpt"))
    with atomic_path(os.path.join(out_dir, "tokenizer.ckpt")) as tmp:
        shutil.copyfile(tokenizer_file, tmp)
    atomic_write_text(os.path.join(out_dir, CUSTOM_MODULE), custom_module())


def custom_module():
    """The text of ``custom.py``: ``TandemASR`` and common/audio_io.py's reading functions, copied from
    their source so the exported model reads audio exactly as ``transcribe.py`` does."""
    readers = (audio_io.to_mono_rate, audio_io.encode_opus, audio_io.decode_opus)
    functions = "\n\n".join(inspect.getsource(f) for f in readers)
    constants = f"SAMPLE_RATE = {audio_io.SAMPLE_RATE}\nOPUS_KBPS_RANGE = {audio_io.OPUS_KBPS_RANGE}\n\n\n"
    return CUSTOM_HEADER + constants + functions + CUSTOM_CLASS


def write_language_model(settings, tokenizer_file, num_tokens, out_dir):
    """``(its config block, its class name)`` of the language model the settings fuse, its weights
    written to ``lm.ckpt``; ``("", None)`` without one."""
    if not settings["lm_dir"] or settings["lm_weight"] <= 0.0:
        return "", None
    lm = load_language_model(settings["lm_dir"], tokenizer_file)  # refuses another tokenizer's LM
    save_torch(lm.state_dict(), os.path.join(out_dir, "lm.ckpt"))
    return "\n" + graph_yaml(read_config_tree(settings["lm_dir"]), num_tokens, block="lm_model"), type(lm).__name__


ONNX_README = """
`encoder.onnx` and `decoder.onnx` run without torch, SpeechBrain or Tandem (`pip install numpy soundfile
onnxruntime`): greedy CTC, or with `--beam N` a CTC prefix beam search whose n-best the attention decoder
rescores (no LM):

    python recipes/finetune/onnx_transcribe.py {out_dir} recording.wav [--beam 8]

When the folder holds `stream_front_end.onnx` and `stream_encoder.onnx` (a model that streams), `--stream`
decodes greedy CTC chunk by chunk, the encoder's state carried across chunks, partial hypotheses on
stderr; `-` reads raw 16-bit PCM at 16 kHz from stdin:

    arecord -f S16_LE -r 16000 -c 1 | python recipes/finetune/onnx_transcribe.py {out_dir} - --stream --chunk_ms 640
"""


def readme(exp_dir, out_dir, settings, onnx=False):
    results_path = os.path.join(exp_dir, "results.txt")
    results = open(results_path, encoding="utf-8").read().strip() if os.path.isfile(results_path) else "(none)"
    return README.format(name=os.path.basename(os.path.abspath(out_dir)), exp_dir=exp_dir, out_dir=out_dir,
                         onnx=ONNX_README.format(out_dir=out_dir) if onnx else "",
                         beam_size=settings["beam_size"], ctc_weight=settings["ctc_weight"],
                         lm=f"{settings['lm_dir']} at weight {settings['lm_weight']}" if settings["lm_weight"] > 0
                         and settings["lm_dir"] else "none",
                         results="\n".join(f"    {line}" for line in results.splitlines()))


def main(argv):
    args = parse_args(argv)
    overrides = {key: getattr(args, key) for key in ("lm_dir", "lm_weight") if getattr(args, key) is not None}
    out_dir = export(args.exp_dir, args.out_dir, args.tokenizer, onnx=args.onnx, **overrides)
    print(f"exported {args.exp_dir} to {out_dir}: EncoderDecoderASR.from_hparams(source={out_dir!r}, "
          "savedir=...)" + (f"; python recipes/finetune/onnx_transcribe.py {out_dir} AUDIO..." if args.onnx else ""))
    return 0


if __name__ == "__main__":
    run_command(main, sys.argv[1:])
