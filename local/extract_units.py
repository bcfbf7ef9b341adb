#!/usr/bin/env python3
"""Discrete units for masked unit prediction (HuBERT iteration 1): features -> k-means -> units.

    python local/extract_units.py SHARD_DIR OUT_DIR [--n-units 100] [--fit-fraction 0.1] [--seed 1]
    python local/extract_units.py DEV_SHARD_DIR DEV_OUT_DIR --kmeans OUT_DIR/kmeans.json

Features (default ``mfcc``: 13 MFCC + delta + delta-delta at 100 Hz, mean/variance normalised per
utterance) are computed from the shards' audio. A MiniBatchKMeans (scikit-learn) is fitted on the
features of a seeded sample of the utterances, then every utterance is labelled with its nearest
centre. OUT_DIR receives ``kmeans.npy`` / ``kmeans.json`` (centres, hash, frame rate) and
``units.parquet`` (one row per sample, see ``common/data/units.py``). ``--kmeans`` applies an existing
model instead of fitting one (validation splits, new corpora).

Resumable: each shard's units go to ``OUT_DIR/parts/{shard}.parquet`` (written under a temporary
name, renamed when complete); a rerun keeps the parts made with the same k-means from the same shard
file (size and modification time, in ``parts/shards.json``) and the fitted model, removes the temporary
files of a killed run and refuses a folder made with other options. Shards rebuilt since (an edited
manifest) are labelled again, and a model fitted on other shards is fitted again: units never outlive
the audio they describe.

Later iterations cluster a trained encoder's states: ``--features EXP_DIR:LAYER`` (the output of encoder
layer LAYER of a pretraining or finetuning experiment, at its frame rate; common/models/encoder_features.py).
Any other extractor: ``--features package.module:factory`` with
``--feature-options '{"json": "kwargs"}'``; ``factory(**options)`` returns an object with
``frame_rate_hz``, ``describe()`` (a JSON-able dict, part of the hash) and
``__call__(waveform [samples] float32 at 16 kHz) -> np.ndarray [frames, dims]`` (for instance the
states of one layer of a pretrained encoder).
"""

import argparse
import hashlib
import importlib
import json
import logging
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common.atomic import atomic_path, atomic_write_text, remove_temporaries
from common.data.shard_audio import BadDataCounts, decoded_audio
from common.data.units import KMEANS_CENTERS, KMEANS_JSON, UNITS_PARQUET, UNITS_SCHEMA, read_kmeans_info
from common.parallel import process_pool
from common.shard_format import read_metadata
from common.user_errors import run_command

logger = logging.getLogger("extract_units")
PARTS = "parts"


class MfccFeatures:
    """13 MFCC + delta + delta-delta (39 dims) every 10 ms, mean/variance normalised per utterance.

    The normalisation keeps k-means distances from being ruled by c0 (loudness) and channel effects.
    """

    frame_rate_hz = 100.0

    def __init__(self, n_mfcc=13):
        from speechbrain.lobes.features import MFCC
        self.n_mfcc = n_mfcc
        self.mfcc = MFCC(deltas=True, context=False, n_mfcc=n_mfcc, sample_rate=16000)

    def describe(self):
        """What defines these features (recorded in kmeans.json and part of the model hash)."""
        return {"name": "mfcc", "n_mfcc": self.n_mfcc, "deltas": 2, "normalise": "utterance"}

    def __call__(self, waveform):
        """Waveform tensor [samples] at 16 kHz -> float32 array [frames, 3 * n_mfcc]."""
        import torch
        with torch.no_grad():
            feats = self.mfcc(waveform.unsqueeze(0))[0].numpy()
        return ((feats - feats.mean(0)) / (feats.std(0) + 1e-5)).astype(np.float32)


def load_feature_extractor(spec, options=None):
    """``mfcc``, ``EXP_DIR:LAYER`` (an encoder layer of a trained experiment) or
    ``package.module:factory`` (called with ``options``) -> a feature extractor."""
    options = options or {}
    if spec == "mfcc":
        return MfccFeatures(**options)
    module_name, _, factory = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if os.path.isdir(module_name):
        if not factory.isdigit():
            raise ValueError(f"--features {spec!r}: after an experiment folder comes its encoder layer number")
        from common.models.encoder_features import EncoderLayerFeatures
        return EncoderLayerFeatures(module_name, int(factory))
    module_name, _, factory = spec.partition(":")
    if not factory:
        raise ValueError(f"--features {spec!r} is neither 'mfcc' nor 'package.module:factory'")
    return getattr(importlib.import_module(module_name), factory)(**options)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Fit k-means on shard audio features and write discrete units per sample. "
        "Rerunning the same command resumes.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("shard_dir", help="shard folder (its metadata_pool.parquet lists the samples)")
    parser.add_argument("out_dir", help="units folder (created)")
    parser.add_argument("--n-units", type=int, default=100, help="k-means clusters")
    parser.add_argument("--fit-fraction", type=float, default=0.1,
                        help="share of the utterances whose features fit k-means")
    parser.add_argument("--min-fit-utterances", type=int, default=50,
                        help="fit on at least this many utterances (all when fewer)")
    parser.add_argument("--max-fit-frames", type=int, default=1_000_000,
                        help="feature frames kept for the fit at most (a seeded subsample beyond)")
    parser.add_argument("--seed", type=int, default=1, help="fixes the fit sample and k-means")
    parser.add_argument("--kmeans", help="kmeans.json of an existing units folder: apply its model")
    parser.add_argument("--features", default="mfcc", help="'mfcc', 'EXP_DIR:LAYER' (encoder layer of a trained "
                        "experiment: HuBERT iteration 2) or 'package.module:factory'")
    parser.add_argument("--feature-options", default="{}", help="JSON keyword arguments of the factory")
    parser.add_argument("--jobs", type=int, default=1, help="processes labelling shards")
    return parser.parse_args(argv)


def samples_by_shard(shard_dir):
    """{tar path: [sample keys]} from the shard folder's pool parquet."""
    table = read_metadata(shard_dir)
    by_shard = {}
    for key, name in zip(table["sample_key"].to_pylist(), table["shard_name"].to_pylist()):
        by_shard.setdefault(os.path.join(shard_dir, name), []).append(key)
    return by_shard


def features_of(by_shard, extractor):
    """Yield ``(key, features [frames, dims])`` of the listed samples, shard by shard."""
    bad_data = BadDataCounts()
    for path, keys in by_shard.items():
        for key, waveform in decoded_audio(path, set(keys), bad_data):
            yield key, extractor(waveform)


def choose_fit_sample(by_shard, fraction, min_utterances, rng):
    """A seeded sample of the utterances, as {tar path: [keys]}."""
    keys = [(path, key) for path, shard_keys in by_shard.items() for key in shard_keys]
    count = min(len(keys), max(min_utterances, int(round(fraction * len(keys)))))
    chosen = sorted(rng.choice(len(keys), size=count, replace=False))
    sample = {}
    for index in chosen:
        path, key = keys[index]
        sample.setdefault(path, []).append(key)
    return sample


def fit_kmeans(by_shard, extractor, args):
    """Fit MiniBatchKMeans on a seeded sample; returns (centres float32 [n_units, dims], fit info)."""
    from sklearn.cluster import MiniBatchKMeans
    rng = np.random.default_rng(args.seed)
    sample = choose_fit_sample(by_shard, args.fit_fraction, args.min_fit_utterances, rng)
    feats = np.concatenate([f for _, f in features_of(sample, extractor)])
    if len(feats) > args.max_fit_frames:
        feats = feats[np.sort(rng.choice(len(feats), args.max_fit_frames, replace=False))]
    if len(feats) < args.n_units:
        raise ValueError(f"{len(feats)} feature frames cannot fit --n-units {args.n_units}: "
                         "raise --fit-fraction or lower --n-units")
    kmeans = MiniBatchKMeans(n_clusters=args.n_units, init="k-means++", batch_size=10000,
                             max_iter=100, n_init=3, max_no_improvement=100, reassignment_ratio=0.0,
                             random_state=args.seed).fit(feats)
    logger.info("k-means %d units fitted on %d frames of %d utterances (inertia/frame %.3f)",
                args.n_units, len(feats), sum(map(len, sample.values())), kmeans.inertia_ / len(feats))
    info = {"fit_utterances": sum(map(len, sample.values())), "fit_frames": len(feats),
            "fit_fraction": args.fit_fraction, "seed": args.seed}
    return kmeans.cluster_centers_.astype(np.float32), info


def kmeans_hash(centres, features):
    """sha256 of the centres' bytes and the feature description: names one k-means model."""
    digest = hashlib.sha256(np.ascontiguousarray(centres, dtype=np.float32).tobytes())
    digest.update(json.dumps(features, sort_keys=True).encode())
    return digest.hexdigest()


def save_kmeans(out_dir, centres, extractor, fit_info):
    """Write kmeans.npy then kmeans.json (atomically); returns the json dict."""
    info = {"hash": kmeans_hash(centres, extractor.describe()), "n_units": int(len(centres)),
            "frame_rate_hz": float(extractor.frame_rate_hz), "features": extractor.describe(),
            **fit_info}
    with atomic_path(os.path.join(out_dir, KMEANS_CENTERS)) as temporary:
        with open(temporary, "wb") as handle:
            np.save(handle, centres)
    atomic_write_text(os.path.join(out_dir, KMEANS_JSON), json.dumps(info, indent=1))
    return info


def load_kmeans(units_dir):
    """(centres, kmeans.json dict) of a units folder, after checking the centres against the hash."""
    info = read_kmeans_info(units_dir)
    centres = np.load(os.path.join(units_dir, KMEANS_CENTERS))
    if kmeans_hash(centres, info["features"]) != info["hash"]:
        raise ValueError(f"{units_dir}/{KMEANS_CENTERS} does not match the hash in {KMEANS_JSON}: "
                         "the folder was modified; rerun local/extract_units.py into a clean folder")
    return centres, info


def prepare_kmeans(args, by_shard, extractor, identities):
    """Fit (or reuse, or copy from --kmeans) the k-means model of OUT_DIR; returns (centres, info)."""
    existing = os.path.join(args.out_dir, KMEANS_JSON)
    if args.kmeans:
        centres, info = load_kmeans(os.path.dirname(os.path.abspath(args.kmeans)))
        if os.path.isfile(existing) and read_kmeans_info(args.out_dir)["hash"] != info["hash"]:
            raise ValueError(f"{args.out_dir} holds units of another k-means model: use a new folder")
        return centres, save_kmeans(args.out_dir, centres, extractor, fit_info_of(info))
    fitted_on = hashlib.sha256(json.dumps(identities, sort_keys=True).encode()).hexdigest()
    if os.path.isfile(existing) and read_kmeans_info(args.out_dir).get("fit_shards") not in (None, fitted_on):
        logger.warning("%s: the shards changed since its k-means model was fitted: fitting it again", args.out_dir)
    elif os.path.isfile(existing):
        centres, info = load_kmeans(args.out_dir)
        wanted = {"n_units": args.n_units, "features": extractor.describe(), "seed": args.seed,
                  "fit_fraction": args.fit_fraction}
        differing = {k: (info.get(k), v) for k, v in wanted.items() if info.get(k) != v}
        if differing:
            raise ValueError(f"{args.out_dir} was made with other options (was, now): {differing}: "
                             "use a new folder or the same options")
        logger.info("reusing the k-means model in %s (%s)", args.out_dir, info["hash"][:12])
        return centres, info
    centres, fit_info = fit_kmeans(by_shard, extractor, args)
    return centres, save_kmeans(args.out_dir, centres, extractor, {**fit_info, "fit_shards": fitted_on})


def shard_identities(by_shard):
    """``{shard name: [size, mtime_ns]}``: what says a shard file is the one its part was made from."""
    stats = {os.path.basename(path): os.stat(path) for path in by_shard}
    return {name: [stat.st_size, stat.st_mtime_ns] for name, stat in stats.items()}


def fit_info_of(info):
    """The fit-describing fields of a kmeans.json (carried when a model is applied elsewhere)."""
    return {k: info[k] for k in ("fit_utterances", "fit_frames", "fit_fraction", "seed") if k in info}


def label_shard(job):
    """Worker: units of every sample of one shard -> parts/{shard}.parquet (atomic). Returns counts."""
    path, keys, out_part, spec, options, centres, info = job
    from sklearn.metrics import pairwise_distances_argmin
    extractor = load_feature_extractor(spec, options)
    rows = []
    for key, feats in features_of({path: keys}, extractor):
        units = pairwise_distances_argmin(feats, centres).astype(np.int16)
        rows.append({"sample_key": key, "units": units, "frame_rate_hz": info["frame_rate_hz"],
                     "kmeans_hash": info["hash"]})
    with atomic_path(out_part) as temporary:
        pq.write_table(pa.Table.from_pylist(rows, schema=UNITS_SCHEMA), temporary)
    return len(rows), len(keys) - len(rows)


def part_is_current(part, kmeans_hash_value, identity, recorded):
    """Whether a shard's part exists, was labelled by this k-means model and from the shard file
    ``recorded`` describes (``identity``: the shard file now)."""
    if not os.path.isfile(part) or identity != recorded:
        return False
    hashes = set(pq.read_table(part, columns=["kmeans_hash"])["kmeans_hash"].to_pylist())
    return hashes <= {kmeans_hash_value}


def label_all(args, by_shard, centres, info, identities):
    """Label every shard that has no current part; returns (samples labelled, samples skipped)."""
    os.makedirs(os.path.join(args.out_dir, PARTS), exist_ok=True)
    options = json.loads(args.feature_options)
    identities_path = os.path.join(args.out_dir, PARTS, "shards.json")
    recorded = json.load(open(identities_path)) if os.path.isfile(identities_path) else {}
    jobs = []
    for path, keys in by_shard.items():
        name = os.path.basename(path)
        part = os.path.join(args.out_dir, PARTS, name + ".parquet")
        if not part_is_current(part, info["hash"], identities[name], recorded.get(name)):
            if os.path.isfile(part):
                os.remove(part)  # of another shard file or model: gone before the new identities are recorded
            jobs.append((path, keys, part, args.features, options, centres, info))
    atomic_write_text(identities_path, json.dumps(identities, sort_keys=True))
    logger.info("%d of %d shards to label (%d done before)", len(jobs), len(by_shard),
                len(by_shard) - len(jobs))
    if args.jobs > 1 and len(jobs) > 1:
        with process_pool(args.jobs) as pool:
            counts = pool.map(label_shard, jobs, chunksize=1)
    else:
        counts = [label_shard(job) for job in jobs]
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def merge_parts(out_dir, by_shard):
    """Concatenate the shards' parts (in shard order) into units.parquet, atomically."""
    parts = [os.path.join(out_dir, PARTS, os.path.basename(p) + ".parquet") for p in sorted(by_shard)]
    table = pa.concat_tables([pq.read_table(part) for part in parts])
    with atomic_path(os.path.join(out_dir, UNITS_PARQUET)) as temporary:
        pq.write_table(table, temporary)
    return table.num_rows


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        extractor = load_feature_extractor(args.features, json.loads(args.feature_options))
        by_shard = samples_by_shard(args.shard_dir)
        os.makedirs(args.out_dir, exist_ok=True)
        for folder in (args.out_dir, os.path.join(args.out_dir, PARTS)):
            remove_temporaries(folder)
        identities = shard_identities(by_shard)
        centres, info = prepare_kmeans(args, by_shard, extractor, identities)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    labelled, skipped = label_all(args, by_shard, centres, info, identities)
    rows = merge_parts(args.out_dir, by_shard)
    logger.info("%s -> %s: %d samples with units (%d labelled now, %d undecodable), k-means %s, %.0f Hz",
                args.shard_dir, args.out_dir, rows, labelled, skipped, info["hash"][:12],
                info["frame_rate_hz"])


if __name__ == "__main__":
    run_command(main)
