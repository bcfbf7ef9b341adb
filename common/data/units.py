"""Discrete speech units (HuBERT-style k-means targets): the on-disk format and its reader.

``local/extract_units.py`` writes a units folder:

- ``kmeans.npy``: the cluster centres [n_units, feature dims] (float32); applying k-means is a
  nearest-centre search, so no pickled model is needed.
- ``kmeans.json``: ``hash`` (sha256 of the centres and the feature description), ``n_units``,
  ``frame_rate_hz``, ``features`` (how the features were computed), and how the fit was sampled.
- ``units.parquet``: one row per sample: ``sample_key`` (string), ``units`` (list of int16, one unit
  per feature frame), ``frame_rate_hz`` (float32), ``kmeans_hash`` (string).

A recipe reads it with :func:`read_units`, which checks that every row was made by the k-means model
of ``kmeans.json`` (and by the one the config expects, when it names a hash).
"""

import json
import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from common.user_errors import UserValueError

logger = logging.getLogger(__name__)

UNITS_PARQUET = "units.parquet"
KMEANS_CENTERS = "kmeans.npy"
KMEANS_JSON = "kmeans.json"

UNITS_SCHEMA = pa.schema([
    ("sample_key", pa.string()),
    ("units", pa.list_(pa.int16())),
    ("frame_rate_hz", pa.float32()),
    ("kmeans_hash", pa.string()),
])


def read_kmeans_info(units_dir):
    """The ``kmeans.json`` of a units folder as a dict."""
    path = os.path.join(units_dir, KMEANS_JSON)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: run local/extract_units.py for {units_dir} first")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def count_units(units_dirs):
    """k-means clusters of a units folder (the first of a list): sizes the unit head in configs,
    ``n_units: !apply:common.data.units.count_units [!ref <units_dirs>]``."""
    first = units_dirs if isinstance(units_dirs, (str, os.PathLike)) else units_dirs[0]
    return int(read_kmeans_info(first)["n_units"])


class UnitTable:
    """Units of every sample of a units folder, looked up by sample key.

    Attributes: ``n_units`` (k-means clusters), ``frame_rate_hz`` (units per second of audio),
    ``kmeans_hash``.
    """

    def __init__(self, units_by_key, n_units, frame_rate_hz, kmeans_hash):
        self.units_by_key = units_by_key
        self.n_units, self.frame_rate_hz, self.kmeans_hash = n_units, frame_rate_hz, kmeans_hash

    def __len__(self):
        return len(self.units_by_key)

    def missing(self, keys):
        """The ``keys`` without units."""
        return [key for key in keys if key not in self.units_by_key]

    def check_covers(self, keys, what):
        """Raise when some of ``keys`` (the samples a loader will read) have no units."""
        missing = self.missing(keys)
        if missing:
            raise UserValueError(f"{len(missing)} of {len(keys)} samples of {what} have no units (e.g. "
                                 f"{missing[:3]}): run local/extract_units.py on its shard folders "
                                 "with the same --kmeans")


def read_units(units_dirs, expected_hash=None):
    """Read one or more units folders made with the same k-means model into a :class:`UnitTable`.

    Arguments
    ---------
    units_dirs : str or list of str
        Folders written by ``local/extract_units.py``.
    expected_hash : str, optional
        The k-means hash the caller was configured for (e.g. the one its checkpoint was trained on).

    Raises
    ------
    ValueError
        When a row, a folder or the caller disagree on the k-means hash or the frame rate.
    """
    units_dirs = [units_dirs] if isinstance(units_dirs, (str, os.PathLike)) else list(units_dirs)
    infos = [read_kmeans_info(folder) for folder in units_dirs]
    reference = expected_hash or infos[0]["hash"]
    units_by_key = {}
    for folder, info in zip(units_dirs, infos):
        if info["hash"] != reference:
            raise UserValueError(f"{folder} holds units of k-means {info['hash'][:12]}, expected "
                                 f"{reference[:12]}: extract them with --kmeans of the same model")
        units_by_key.update(read_unit_rows(folder, info))
    logger.info("units of %d samples from %s (k-means %s, %d units, %.1f Hz)", len(units_by_key),
                units_dirs, reference[:12], infos[0]["n_units"], infos[0]["frame_rate_hz"])
    return UnitTable(units_by_key, int(infos[0]["n_units"]), float(infos[0]["frame_rate_hz"]),
                     reference)


def read_unit_rows(folder, info):
    """{sample_key: int16 array} of one folder's parquet, after checking every row's hash and rate."""
    table = pq.read_table(os.path.join(folder, UNITS_PARQUET))
    hashes = set(table["kmeans_hash"].to_pylist())
    rates = set(table["frame_rate_hz"].to_pylist())
    if hashes - {info["hash"]}:
        raise UserValueError(f"{folder}/{UNITS_PARQUET} has rows of k-means {sorted(hashes)}, but its "
                             f"{KMEANS_JSON} says {info['hash']}: rerun local/extract_units.py into a "
                             "clean folder")
    if any(abs(rate - info["frame_rate_hz"]) > 1e-3 for rate in rates):
        raise UserValueError(f"{folder}: frame rates {sorted(rates)} Hz differ from {KMEANS_JSON}'s "
                             f"{info['frame_rate_hz']} Hz: rerun local/extract_units.py")
    keys = table["sample_key"].to_pylist()
    units = table["units"].to_numpy(zero_copy_only=False)
    return {key: np.asarray(row, dtype=np.int16) for key, row in zip(keys, units)}


def units_at_frames(units, unit_lengths, num_frames, frame_rate_hz, unit_rate_hz):
    """Resample padded units to another frame rate: the unit under the centre of each frame.

    Output frame ``i`` is centred on unit frame ``i * unit_rate_hz / frame_rate_hz``, as frame ``i``
    of a 'same'-padded strided front-end is centred on its input frame ``i * stride``.

    Arguments
    ---------
    units : torch.LongTensor
        [batch, unit frames] padded with -1.
    unit_lengths : torch.Tensor
        Units per sample [batch].
    num_frames : int
        Frames of the output (e.g. encoder frames of the padded batch).
    frame_rate_hz, unit_rate_hz : float
        Rates of the output frames (e.g. 25 Hz after a stride-4 front-end) and of the units (100 Hz).

    Returns
    -------
    torch.LongTensor
        [batch, num_frames]; -1 where a frame lies past the sample's last unit.
    """
    centres = torch.arange(num_frames, dtype=torch.float64) * unit_rate_hz / frame_rate_hz
    index = centres.round().long().unsqueeze(0).expand(len(units), -1)
    inside = index < unit_lengths.unsqueeze(1).to(index.device)
    picked = units.gather(1, index.clamp(max=units.shape[1] - 1).to(units.device))
    return torch.where(inside.to(units.device), picked, torch.full_like(picked, -1))
