"""Read a Hugging Face dataset saved as parquet (``Dataset.to_parquet`` or the Hub's ``data/*.parquet``).

Each row holds its audio in a column (``audio`` by default) that is a struct of ``bytes`` and ``path``.
The bytes are written to ``extract_dir``, named by the sample key, atomically; a rerun rewrites only
the files whose bytes changed, and their sha256 (``Entry.audio_sha256``) is part of make_shards' input
fingerprint. A row without
bytes uses its ``path`` as it is (resolved against the parquet's folder). The transcript column is
``--text-field`` or the first of :data:`TEXT_COLUMNS` present; keys come from the key columns, else
the audio path's stem, else ``{parquet stem}_{row}``. Other scalar columns are carried into the
sample's json (``speaker_id`` ...). Rows are read in record batches: a large dataset never sits in
memory whole.
"""

import glob
import hashlib
import os

import pyarrow.parquet as pq

from common.atomic import atomic_path

TEXT_COLUMNS = ("text", "sentence", "transcription", "transcript", "normalized_text")
KEY_COLUMNS = ("id", "key", "utt_id", "audio_id", "segment_id")
SPEAKER_COLUMNS = ("speaker", "speaker_id", "client_id")
BATCH_ROWS = 64
EXTRACTED_KEY = "_extracted_key"  # set on rows whose bytes were extracted: the file's stem


def parquet_files(path):
    """The parquet files of ``path``: itself, or every ``*.parquet`` below a folder (sorted)."""
    if os.path.isfile(path):
        return [path]
    return sorted(glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True))


def holds_hf_parquet(folder):
    """Whether a folder is a parquet dataset: parquet files and no shard parquet (metadata_pool)."""
    files = parquet_files(folder)
    return bool(files) and not any(os.path.basename(f).startswith("metadata_") for f in files)


def column_names(path, fields):
    """(audio, text or None, key columns, speaker or None) of the first parquet file, checked."""
    names = pq.read_schema(path).names
    audio = fields.audio
    if audio not in names:
        raise ValueError(f"{path} has no audio column {audio!r} (columns: {names}): pass --audio-field")
    text = fields.text if fields.text in names else next((c for c in TEXT_COLUMNS if c in names), None)
    keys = tuple(c for c in fields.key if c in names) or tuple(c for c in KEY_COLUMNS if c in names)
    speaker = fields.speaker if fields.speaker in names else next((c for c in SPEAKER_COLUMNS if c in names), None)
    return audio, text, keys, speaker


def iter_records(files, audio, keys, extract_dir):
    """``(origin, base folder, record, audio sha256)`` per row, the record's audio column replaced by a
    file path (None when the row has neither bytes nor a path), non-scalar columns dropped; for
    extracted bytes the key the file was named by in :data:`EXTRACTED_KEY` and their sha256 (else None)."""
    os.makedirs(extract_dir, exist_ok=True)
    for file in files:
        stem, base = os.path.splitext(os.path.basename(file))[0], os.path.dirname(os.path.abspath(file))
        row = 0
        for batch in pq.ParquetFile(file).iter_batches(batch_size=BATCH_ROWS):
            for record in batch.to_pylist():
                path, digest = audio_file(record.get(audio), record, keys, base, extract_dir, f"{stem}_{row:08d}")
                record = {k: v for k, v in record.items() if isinstance(v, (str, int, float, bool))}
                record[audio] = path
                if digest:  # the key its file was named by
                    record[EXTRACTED_KEY] = os.path.splitext(os.path.basename(path))[0]
                yield f"{os.path.basename(file)}:row {row}", base, record, digest
                row += 1


def audio_file(value, record, keys, base, extract_dir, default_name):
    """``(path, sha256)`` of the row's audio: its bytes written to ``extract_dir`` (with their sha256),
    or its own path (sha256 None); path None if neither."""
    if isinstance(value, str):
        return (value if os.path.isabs(value) else os.path.join(base, value)), None
    if not isinstance(value, dict):
        return None, None
    source = value.get("path") or ""
    if not value.get("bytes"):
        return ((source if os.path.isabs(source) else os.path.join(base, source)) if source else None), None
    key = next((str(record[k]) for k in keys if record.get(k) not in (None, "")), None)
    name = (key or os.path.splitext(os.path.basename(source))[0] or default_name).replace("/", "_")
    target = os.path.join(extract_dir, name + (os.path.splitext(source)[1] or ".audio"))
    if not same_bytes(target, value["bytes"]):  # a rerun rewrites only what the dataset changed
        with atomic_path(target) as temporary, open(temporary, "wb") as handle:
            handle.write(value["bytes"])
    return target, hashlib.sha256(value["bytes"]).hexdigest()


def same_bytes(path, data):
    if not os.path.isfile(path) or os.path.getsize(path) != len(data):
        return False
    with open(path, "rb") as handle:
        return handle.read() == data
