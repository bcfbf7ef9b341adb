#!/usr/bin/env python3
"""Frozen-encoder probe: how linearly readable the transcript is at each encoder layer.

    python bench/probe.py --exp exp/pretrain_small --scratch \\
        --train data/open/shards/train/metadata_core.parquet --dev data/open/shards/dev/metadata_pool.parquet \\
        [--updates 400] [--max-utterances 300] [--json]

The encoder of ``--exp`` (a pretraining or finetuning experiment: its config's graph, the newest
checkpoint's ``model`` and feature statistics) stays frozen. Each layer's output (layer 0: the input
projection after the front-end; 1..L: the conformer layers) feeds its own linear CTC head over the
tokenizer's pieces, trained ``--updates`` Adam steps on the ``--train`` utterances (their transcripts),
then decoded greedily on ``--dev``: CER per layer with its bootstrap 95 % interval (bench/stats.py).
``--scratch`` probes the same graph with seeded random weights (and the experiment's feature statistics,
which are data, not learning) beside it: where pretraining put readable information, and in which layer.

A layer whose probe is no better than scratch's learned nothing the transcript needs; a CER that falls
then rises with depth says the top layers specialised to the pretraining targets (finetune lower ones
harder, or take a lower layer's units). The probe reads the states only: the same number of updates for
every layer and model, so the figures compare, not converge.
"""

import argparse
import json
import logging
import os
import sys
import tempfile

import numpy as np
import torch
from hyperpyyaml import load_hyperpyyaml

from bench import stats
from common.data import SpeechLoaderConfig, Tokenizer, make_speech_loader, vocab_size
from common.models.experiment import graph_yaml, read_config_tree
from common.models.transfer import TOKENIZER_COPY, load_pretrained
from common.tokens import BLANK

logger = logging.getLogger(__name__)


def load_encoder(exp_dir, tokenizer_file, pretrained=True, seed=0):
    """The model graph of an experiment's config, its checkpoint's weights loaded (``pretrained``) or
    seeded random ones; the feature statistics are the checkpoint's either way. In eval mode."""
    torch.manual_seed(seed)
    graph = load_hyperpyyaml(graph_yaml(read_config_tree(exp_dir), vocab_size(tokenizer_file)))
    loadables = {"normalize": graph["normalize"], **({"model": graph["model"]} if pretrained else {})}
    with tempfile.TemporaryDirectory() as collect_in:
        load_pretrained(exp_dir, loadables, collect_in)
    return graph["model"].eval()


@torch.no_grad()
def layer_states(model, wavs, wav_lens):
    """Outputs of the input projection (layer 0) and of every encoder layer: a list of [batch, frames, d]."""
    captured = {}
    modules = [model.transformer.custom_src_module, *model.transformer.encoder.layers]
    hooks = [module.register_forward_hook(
        lambda _, __, output, index=index: captured.__setitem__(index, output[0] if isinstance(output, tuple)
                                                                  else output))
        for index, module in enumerate(modules)]
    try:
        model.encode(wavs, wav_lens)
    finally:
        for hook in hooks:
            hook.remove()
    return [captured[index] for index in range(len(modules))]


def collect(model, loader):
    """Per-layer lists of per-utterance states [frames, d] (float32, CPU), token lists, keys and texts."""
    per_layer, tokens, keys, texts = None, [], [], []
    for batch in loader:
        wavs, wav_lens = batch.sig
        states = layer_states(model, wavs, wav_lens)
        per_layer = per_layer or [[] for _ in states]
        frames = torch.round(wav_lens * states[0].shape[1]).long()
        for layer, output in zip(per_layer, states):
            layer += [output[i, :n].float().clone() for i, n in enumerate(frames.tolist())]
        ids, rel = batch.tokens
        tokens += [ids[i, :int(round(float(r) * ids.shape[1]))].clone() for i, r in enumerate(rel)]
        keys += list(batch.id)
        texts += list(batch.text)
    return per_layer, tokens, keys, texts


def pad(rows):
    """Pad a list of [frames, d] (or 1-D) tensors; returns (padded, lengths)."""
    lengths = torch.tensor([len(row) for row in rows])
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), lengths


def train_ctc_probe(features, targets, vocab, updates=400, batch_size=16, lr=2e-3, seed=0):
    """A linear CTC head (blank = 0) on frozen ``features`` (list of [frames, d]) against ``targets``
    (list of 1-D token tensors), trained ``updates`` Adam steps on random minibatches. Features are
    standardised with their training mean and std (kept in the returned head)."""
    generator = torch.Generator().manual_seed(seed)
    frames = torch.cat(features)
    mean, std = frames.mean(0), frames.std(0).clamp(min=1e-5)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = torch.nn.Sequential(Standardise(mean, std), torch.nn.Linear(frames.shape[1], vocab))
    optimizer = torch.optim.Adam(head[1].parameters(), lr=lr)
    for _ in range(updates):
        pick = torch.randint(len(features), (min(batch_size, len(features)),), generator=generator).tolist()
        x, x_lens = pad([features[i] for i in pick])
        y, y_lens = pad([targets[i] for i in pick])
        log_probs = torch.log_softmax(head(x), -1).transpose(0, 1)
        loss = torch.nn.functional.ctc_loss(log_probs, y, x_lens, y_lens, blank=BLANK, zero_infinity=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()


class Standardise(torch.nn.Module):
    """(x - mean) / std with fixed statistics."""

    def __init__(self, mean, std):
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, x):
        return (x - self.mean) / self.std


@torch.no_grad()
def greedy_ids(head, features):
    """Greedy CTC token ids of each utterance (repeats merged, blanks dropped)."""
    out = []
    for feature in features:
        best = torch.unique_consecutive(head(feature).argmax(-1))
        out.append(best[best != BLANK].tolist())
    return out


def probe_layers(train_layers, train_tokens, dev_layers, dev_refs, decode, vocab, **train_options):
    """CER (bench.stats Estimate, %) per layer: a probe trained on each train layer, decoded on the dev
    layer's states with ``decode(ids) -> text`` and scored against ``dev_refs`` ({key: text}, in order)."""
    keys = list(dev_refs)
    results = []
    for layer, (train_states, dev_states) in enumerate(zip(train_layers, dev_layers)):
        head = train_ctc_probe(train_states, train_tokens, vocab, **train_options)
        hyps = {key: decode(ids) for key, ids in zip(keys, greedy_ids(head, dev_states))}
        results.append(stats.error_rate(stats.score(dev_refs, hyps, unit="char")))
        logger.info("layer %d: CER %.1f %%", layer, results[-1].value)
    return results


def labelled_loader(parquet, tokenizer, max_utterances=0, units=None):
    """Every utterance of ``parquet`` with its tokens (and ``units``) in batches of up to 16, or a seeded
    random ``max_utterances`` of them."""
    loader = make_speech_loader(parquet, tokenizer, SpeechLoaderConfig(max_batch_seconds=120.0, max_batch_size=16),
                                share="batches", units=units)
    if max_utterances:
        used = loader.used_rows()
        keep = np.zeros(len(loader.metadata), dtype=bool)
        keep[used[np.random.default_rng(0).permutation(len(used))[:max_utterances]]] = True
        loader.metadata.shard_of_row = np.where(keep, loader.metadata.shard_of_row, -1)
    return loader


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exp", required=True, help="pretraining or finetuning experiment folder")
    parser.add_argument("--train", required=True, help="labelled metadata parquet the probes train on")
    parser.add_argument("--dev", required=True, help="labelled metadata parquet the probes are scored on")
    parser.add_argument("--tokenizer", help="SentencePiece model (default: the experiment's copy)")
    parser.add_argument("--scratch", action="store_true", help="also probe the same graph with random weights")
    parser.add_argument("--updates", type=int, default=400, help="Adam steps per probe (default 400)")
    parser.add_argument("--max-utterances", type=int, default=300, help="train utterances used (0: all)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tokenizer_file = args.tokenizer or os.path.join(args.exp, TOKENIZER_COPY)
    if not os.path.isfile(tokenizer_file):
        parser.error(f"{tokenizer_file} not found: pass --tokenizer (the experiment's tokenizer)")
    tokenizer = Tokenizer(tokenizer_file)
    decode = lambda ids: tokenizer.processor.decode(ids)  # noqa: E731
    rows = []
    for name, pretrained in [("trained", True)] + ([("scratch", False)] if args.scratch else []):
        model = load_encoder(args.exp, tokenizer_file, pretrained)
        train_layers, train_tokens, _, _ = collect(model, labelled_loader(args.train, tokenizer, args.max_utterances))
        dev_layers, _, dev_keys, dev_texts = collect(model, labelled_loader(args.dev, tokenizer, 0))
        cers = probe_layers(train_layers, train_tokens, dev_layers, dict(zip(dev_keys, dev_texts)), decode,
                            vocab_size(tokenizer_file), updates=args.updates)
        rows += [{"encoder": name, "layer": layer, "cer": cer.value, "cer_ci": [cer.low, cer.high]}
                 for layer, cer in enumerate(cers)]
    print("| encoder | layer | dev CER % | 95 % interval |\n|---|---|---|---|")
    for row in rows:
        low, high = row["cer_ci"]
        print(f"| {row['encoder']} | {row['layer']} | {row['cer']:.1f} | {low:.1f}-{high:.1f} |")
    if args.json:
        print(json.dumps({"exp": args.exp, "updates": args.updates, "layers": rows}))


if __name__ == "__main__":
    sys.exit(main())
