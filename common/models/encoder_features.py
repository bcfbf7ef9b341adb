"""Features for a second k-means iteration (HuBERT iteration 2): the states of one encoder layer of a
trained experiment.

    python local/extract_units.py shards/train units/train_it2 --features exp/pretrain_small:3

``EncoderLayerFeatures(exp_dir, layer)`` rebuilds the experiment's model graph from its resolved config
(``hyperparams.yaml``), loads its weights and returns the output of encoder layer ``layer`` (1 = the
first) at the encoder's frame rate: the targets then match the encoder frames they train. The weights
are those the experiment's figures come from: a finetuning's averaged model (``averaged.ckpt``, written
by its test stage) where there is one, else the newest checkpoint's ``model.ckpt`` and
``normalize.ckpt`` (a pretraining).
"""

import hashlib
import os
import tempfile

import torch
from hyperpyyaml import load_hyperpyyaml

from common.data import vocab_size
from common.models.experiment import AVERAGED_FILE, graph_yaml, read_config_tree
from common.models.transfer import TOKENIZER_COPY, load_pretrained


class EncoderLayerFeatures:
    """``__call__(waveform [samples] at 16 kHz) -> float32 array [encoder frames, d_model]``.

    Arguments
    ---------
    exp_dir : str
        An experiment folder of recipes/pretrain or recipes/finetune (hyperparams.yaml, save/CKPT+*).
    layer : int
        Which encoder layer's output, 1 to the number of layers.
    """

    def __init__(self, exp_dir, layer):
        tree = read_config_tree(exp_dir)
        tokenizer = os.path.join(exp_dir, TOKENIZER_COPY)
        graph = load_hyperpyyaml(graph_yaml(tree, vocab_size(tokenizer if os.path.isfile(tokenizer)
                                                             else tree["tokenizer_file"])))
        self.model = graph["model"]
        layers = self.model.transformer.encoder.layers
        if not 1 <= int(layer) <= len(layers):
            raise ValueError(f"layer {layer}: the encoder of {exp_dir} has layers 1 to {len(layers)}")
        averaged = os.path.join(exp_dir, AVERAGED_FILE)
        if os.path.isfile(averaged):
            state = torch.load(averaged, map_location="cpu")
            self.model.load_state_dict(state["model"], strict=True)
            if state.get("normalize") is not None:
                graph["normalize"]._load_statistics_dict(state["normalize"])
            self.weights = averaged
        else:
            with tempfile.TemporaryDirectory() as collect_in:
                checkpoint = load_pretrained(exp_dir, {"model": self.model, "normalize": graph["normalize"]},
                                             collect_in)
            self.weights = os.path.join(checkpoint, "model.ckpt")
        self.model.eval()
        self.exp_dir, self.layer = os.path.abspath(exp_dir), int(layer)
        self.frame_rate_hz = self.model.frames_per_second()
        self._captured = None
        layers[self.layer - 1].register_forward_hook(self._capture)

    def _capture(self, module, inputs, output):
        self._captured = output[0] if isinstance(output, tuple) else output

    def describe(self):
        """What defines these features (recorded in kmeans.json, part of the k-means hash)."""
        with open(self.weights, "rb") as handle:
            weights = hashlib.sha256(handle.read()).hexdigest()
        return {"name": "encoder_layer", "experiment": os.path.basename(self.exp_dir), "layer": self.layer,
                "weights": os.path.basename(self.weights), "model_sha256": weights}

    def __call__(self, waveform):
        with torch.no_grad():
            self.model.encode(torch.as_tensor(waveform, dtype=torch.float32)[None], torch.ones(1))
        return self._captured[0].float().numpy()
