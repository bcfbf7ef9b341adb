"""The on-disk shard format shared by the writers (``local/``) and the readers (``common/data``).

A shard folder holds:

- ``{prefix}-{index:06d}.tar``: POSIX tars; each sample is two consecutive members, ``{key}.opus``
  (Ogg Opus, 16 kHz mono) then ``{key}.json`` (``text``, ``duration`` in seconds, ``source``, plus the
  corpus's carried fields such as ``speaker``, ``lang``, ``translation``).
- ``metadata_pool.parquet``: one row per sample (:data:`METADATA_SCHEMA`), so that filtering, batch
  planning and rank balancing read durations and texts without opening a tar. ``*_offset``/``*_size``
  locate each member's data inside its tar for random access.
- ``metadata_core.parquet``: a filtered subset with the same schema.

Untranscribed speech (``make_shards.py --unlabelled``, for pretraining) has a null ``text`` in both
members, and its parquets carry ``unlabelled: true`` in their schema metadata (:func:`is_unlabelled`).
"""

import io
import json
import os
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq

from common.atomic import atomic_path

POOL_PARQUET = "metadata_pool.parquet"
CORE_PARQUET = "metadata_core.parquet"
SHARD_NAME_FORMAT = "{prefix}-{index:06d}.tar"
CARRIED_COLUMNS = ("speaker", "lang")  # carried fields promoted to columns; the rest go to ``extra``

METADATA_SCHEMA = pa.schema([
    ("sample_key", pa.string()),
    ("text", pa.string()),
    ("duration", pa.float64()),
    ("shard_name", pa.string()),
    ("speaker", pa.string()),
    ("lang", pa.string()),
    ("source", pa.string()),
    ("opus_offset", pa.int64()),
    ("opus_size", pa.int64()),
    ("json_offset", pa.int64()),
    ("json_size", pa.int64()),
    ("extra", pa.string()),
])


def sample_json(text, duration, source, fields):
    """The ``{key}.json`` member: text, duration (s), source and the carried fields."""
    return {"text": text, "duration": round(duration, 4), "source": source, **fields}


def metadata_row(key, sample, shard_name, offsets):
    """One parquet row for a sample; ``offsets`` = (opus_offset, opus_size, json_offset, json_size)."""
    carried = {k: v for k, v in sample.items() if k not in ("text", "duration", "source")}
    row = {"sample_key": key, "text": sample["text"], "duration": sample["duration"],
           "shard_name": shard_name, "source": sample["source"]}
    row.update({column: _as_text(carried.pop(column, None)) for column in CARRIED_COLUMNS})
    row.update(zip(("opus_offset", "opus_size", "json_offset", "json_size"), offsets))
    row["extra"] = json.dumps(carried, ensure_ascii=False, sort_keys=True)
    return row


def _as_text(value):
    return None if value is None else str(value)


UNLABELLED_KEY = b"unlabelled"


def write_metadata(rows, path, unlabelled=False):
    """Write ``rows`` (dicts of :data:`METADATA_SCHEMA`) to a parquet file, atomically; ``unlabelled``
    marks a folder sharded as untranscribed speech."""
    schema = METADATA_SCHEMA.with_metadata({UNLABELLED_KEY: b"true"}) if unlabelled else METADATA_SCHEMA
    table = pa.Table.from_pylist(rows, schema=schema)
    with atomic_path(path) as temporary:
        pq.write_table(table, temporary)


def read_metadata(path):
    """A shard folder's parquet (``path`` a folder = its pool) as a pyarrow Table."""
    if os.path.isdir(path):
        path = os.path.join(path, POOL_PARQUET)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: run local/make_shards.py to create the shards first")
    return pq.read_table(path)


def is_unlabelled(path):
    """True for the parquet of a folder sharded with ``--unlabelled`` (untranscribed speech)."""
    metadata = pq.read_schema(path).metadata or {}
    return metadata.get(UNLABELLED_KEY) == b"true"


class ShardWriter:
    """Append samples to one tar and record where each member's data lies.

    >>> writer = ShardWriter("shard.tar.tmp")               # doctest: +SKIP
    >>> offsets = writer.add("utt1", opus_bytes, json_bytes)
    >>> writer.close()
    """

    def __init__(self, path):
        self.path = path
        self.tar = tarfile.open(path, "w", format=tarfile.GNU_FORMAT)
        self.samples = 0

    @property
    def size(self):
        """Bytes the finished tar will take if closed now (end-of-archive blocks and record padding)."""
        return self.tar.offset + tarfile.RECORDSIZE

    @staticmethod
    def bytes_needed(key, opus, json_bytes):
        """Upper bound of the bytes one sample adds: two headers and two 512-padded bodies."""
        header = 512 * (1 + (len(key) + 5 > 99) * 3)  # GNU long names take extra blocks
        return 2 * header + _padded(len(opus)) + _padded(len(json_bytes))

    def add(self, key, opus, json_bytes):
        """Append ``{key}.opus`` and ``{key}.json``; return their (offset, size, offset, size)."""
        opus_offset = self._add_member(f"{key}.opus", opus)
        json_offset = self._add_member(f"{key}.json", json_bytes)
        self.samples += 1
        return opus_offset, len(opus), json_offset, len(json_bytes)

    def _add_member(self, name, data):
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o644  # fixed mtime: reproducible shards
        header = info.tobuf(self.tar.format, self.tar.encoding, self.tar.errors)
        data_offset = self.tar.offset + len(header)
        self.tar.addfile(info, io.BytesIO(data))
        return data_offset

    def close(self):
        self.tar.close()


def _padded(size):
    return (size + 511) // 512 * 512



# ---- Text shards (local/make_text_shards.py -> common/data/text.py) ----
# A text corpus ``text/NAME.parquet`` is its metadata: one row per sentence (pair) in shard order,
# with the sentence's shard and character count, so a loader plans without reading the text. The
# sentences themselves lie beside it in ``NAME-{index:06d}.parquet`` shards (:data:`TEXT_SHARD_SCHEMA`),
# each read whole by one dataloader worker. ``text_shards: true`` in the metadata's schema marks the form.

TEXT_SHARD_NAME_FORMAT = "{stem}-{index:06d}.parquet"
TEXT_SHARDS_KEY = b"text_shards"
TEXT_SHARD_SCHEMA = pa.schema([
    ("sample_key", pa.string()),
    ("text", pa.string()),         # source (mono text: the sentence)
    ("translation", pa.string()),  # target of a pair; null for mono text
    ("lang", pa.string()),         # language names: the loader turns them into <lang> tags
    ("tgt_lang", pa.string()),
])
TEXT_METADATA_SCHEMA = pa.schema([
    ("sample_key", pa.string()),
    ("shard_name", pa.string()),
    ("chars", pa.int32()),  # characters of source + target
]).with_metadata({TEXT_SHARDS_KEY: b"true"})


def text_shard_name(metadata_path, index):
    """File name of shard ``index`` of the text corpus whose metadata is ``metadata_path``."""
    stem = os.path.splitext(os.path.basename(metadata_path))[0]
    return TEXT_SHARD_NAME_FORMAT.format(stem=stem, index=index)


def is_text_metadata(path):
    """True for the metadata parquet of text shards (``local/make_text_shards.py``)."""
    return (pq.read_schema(path).metadata or {}).get(TEXT_SHARDS_KEY) == b"true"


def text_shard_paths(metadata_path):
    """Absolute paths of a text corpus's shards, in shard order: the ``shard_name`` column read in
    pieces of 64k rows, so that memory does not grow with the sentences."""
    if not is_text_metadata(metadata_path):
        raise ValueError(f"{metadata_path} is not the metadata of text shards: make it with "
                         "local/make_text_shards.py (a text parquet of an older version: run it again)")
    folder = os.path.dirname(os.path.abspath(metadata_path))
    names = {}
    for batch in pq.ParquetFile(metadata_path).iter_batches(batch_size=1 << 16, columns=["shard_name"]):
        names.update(dict.fromkeys(batch.column(0).unique().to_pylist()))
    return [os.path.join(folder, name) for name in names]


def write_text_shard(path, columns, fingerprint=None):
    """Write one text shard (a dict of :data:`TEXT_SHARD_SCHEMA` column lists) atomically; ``fingerprint``
    (bytes) goes into its schema metadata (what wrote it, for a rerun to recognise)."""
    schema = TEXT_SHARD_SCHEMA if fingerprint is None else TEXT_SHARD_SCHEMA.with_metadata({b"writer": fingerprint})
    with atomic_path(path) as temporary:
        pq.write_table(pa.Table.from_pydict(columns, schema=schema), temporary)


def shard_fingerprint(path):
    """The ``fingerprint`` a shard was written with (None if none, or no shard)."""
    return (pq.read_schema(path).metadata or {}).get(b"writer") if os.path.exists(path) else None


def text_metadata_table(columns, shard_name):
    """The metadata rows of one shard's columns (a dict as :func:`write_text_shard` takes)."""
    targets = columns.get("translation") or [None] * len(columns["text"])
    return pa.Table.from_pydict({
        "sample_key": columns["sample_key"],
        "shard_name": [shard_name] * len(columns["sample_key"]),
        "chars": [len(text) + len(target or "") for text, target in zip(columns["text"], targets)],
    }, schema=TEXT_METADATA_SCHEMA)
