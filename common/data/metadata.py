"""Read shard metadata parquets (``metadata_pool.parquet`` / ``metadata_core.parquet``) into arrays.

Only the columns planning needs are read (pyarrow column projection); rows are put in tar order
(shard, then ``opus_offset``), so a shard's rows are in the order a reader meets them.
"""

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common.shard_format import CARRIED_COLUMNS, METADATA_SCHEMA
from common.user_errors import UserValueError

logger = logging.getLogger(__name__)

SPEECH_COLUMNS = ["sample_key", "text", "duration", "shard_name", "opus_offset"]  # what planning reads
TEXT_COLUMNS = ("text", *CARRIED_COLUMNS, "source")  # text fields that are parquet columns
_unknown = set(SPEECH_COLUMNS + list(TEXT_COLUMNS)) - set(METADATA_SCHEMA.names)
if _unknown:  # pragma: no cover - a programming error caught at import
    raise ImportError(f"metadata readers name columns {sorted(_unknown)} that common/shard_format.py does not write")


@dataclass
class SpeechMetadata:
    """Per-row arrays of a speech corpus, rows in tar order.

    keys, texts : np.ndarray of str (a text is None where the sample lacks the chosen text field)
    durations : np.ndarray of float64, seconds
    shard_of_row : np.ndarray of int64, index into ``shard_paths``
    shard_paths : list of str, absolute tar paths
    """

    keys: np.ndarray
    texts: np.ndarray
    durations: np.ndarray
    shard_of_row: np.ndarray
    shard_paths: list

    def __len__(self):
        return len(self.keys)

    @property
    def seconds(self):
        """Total audio in seconds."""
        return float(self.durations.sum())


def read_table(parquet_paths, columns):
    """Concatenate the given parquets (str, Path or list); add ``shard_path`` resolved per file."""
    paths = [Path(p) for p in ([parquet_paths] if isinstance(parquet_paths, (str, Path)) else parquet_paths)]
    if not paths:
        raise UserValueError("no metadata parquet given: pass OUT_DIR/metadata_pool.parquet of local/make_shards.py")
    tables = []
    for path in paths:
        table = pq.read_table(path, columns=columns)
        shard_dir = str(path.resolve().parent)
        shard_paths = pa.array([f"{shard_dir}/{name}" for name in table["shard_name"].to_pylist()], pa.string())
        tables.append(table.append_column("shard_path", shard_paths))
    return pa.concat_tables(tables)


def read_speech_metadata(parquet_paths, text_field="text"):
    """Read speech metadata from one or more parquets of the shard contract.

    ``text_field`` picks the target text: a parquet column (``text``) or a key of the ``extra`` JSON
    column (e.g. ``translation``); samples that lack it get ``None``.
    """
    columns = SPEECH_COLUMNS if text_field == "text" else SPEECH_COLUMNS + [_source_column(text_field)]
    table = read_table(parquet_paths, list(dict.fromkeys(columns)))
    table = table.sort_by([("shard_path", "ascending"), ("opus_offset", "ascending")])
    shard_paths, shard_of_row = np.unique(table["shard_path"].to_numpy(zero_copy_only=False), return_inverse=True)
    metadata = SpeechMetadata(
        keys=table["sample_key"].to_numpy(zero_copy_only=False),
        texts=read_text_field(table, text_field),
        durations=table["duration"].to_numpy().astype(np.float64),
        shard_of_row=shard_of_row.astype(np.int64),
        shard_paths=shard_paths.tolist(),
    )
    logger.info("%d samples, %.1f h in %d shards from %s", len(metadata), metadata.seconds / 3600,
                len(metadata.shard_paths), parquet_paths)
    return metadata


def _source_column(text_field):
    """The parquet column holding ``text_field``: itself for a column, else ``extra``."""
    return text_field if text_field in TEXT_COLUMNS else "extra"


def read_text_field(table, text_field):
    """``text_field`` of every row as an object array (None where a row lacks it).

    Raises ValueError, naming the fields that do exist, when no row has it.
    """
    if _source_column(text_field) != "extra":
        texts = table[text_field].to_pylist()
    else:
        extras = [json.loads(extra or "{}") for extra in table["extra"].to_pylist()]
        texts = [extra.get(text_field) for extra in extras]
        if extras and all(text is None for text in texts):
            known = sorted({key for extra in extras for key in extra} | set(TEXT_COLUMNS))
            raise UserValueError(f"text_field={text_field!r} is in no sample of the metadata: use one of {known}")
    texts = [text if isinstance(text, str) and text.strip() else None for text in texts]
    return np.array(texts, dtype=object)
