"""Read a user's corpus into entries (key, audio path, text, carried fields) and rejects.

Four layouts are understood; each reader returns ``(entries, rejects)`` and never raises on a bad line:
the line becomes a reject with a reason, so one broken entry never costs the rest of the corpus.

- ``jsonl``: one JSON object a line with ``audio`` and ``text`` (optional ``id``/``key``, ``speaker``,
  ``lang``, ``duration``; any other field is carried into the sample's json).
- ``tsv``: a header line naming the columns, at least ``path`` and ``text``.
- ``kaldi``: a folder with ``wav.scp`` (no pipes), ``text``, optional ``utt2spk`` and ``segments``.
- ``folder``: audio files (wav / flac / ogg / opus / mp3) under a folder, each with a same-named ``.txt``.

Relative audio paths resolve against the manifest's folder.
"""

import csv
import dataclasses
import io
import json
import os
import re

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".opus", ".mp3")
FORMATS = ("jsonl", "tsv", "kaldi", "folder")
KEY_FIELDS = ("id", "key", "utt_id")
RESERVED_FIELDS = {"audio", "path", "text", "duration", *KEY_FIELDS}


@dataclasses.dataclass
class Entry:
    """One utterance to shard: ``start_s``/``end_s`` select a segment (Kaldi ``segments``)."""
    key: str
    audio: str
    text: str
    origin: str  # where it was read: "train.jsonl:12"
    fields: dict = dataclasses.field(default_factory=dict)
    start_s: float | None = None
    end_s: float | None = None

    def source(self):
        """The audio this sample came from, as stored in its json (segment bounds appended)."""
        if self.start_s is None:
            return self.audio
        return f"{self.audio}#{self.start_s:.3f}-{self.end_s:.3f}"


def make_reject(key, origin, reason, detail):
    """A rejects-file record: the entry's key (or None), where it was read, why, and what to do."""
    return {"key": key, "origin": origin, "reason": reason, "detail": detail}


def detect_format(path):
    """Name the layout of ``path`` from its extension or its folder's contents."""
    if os.path.isdir(path):
        return "kaldi" if os.path.isfile(os.path.join(path, "wav.scp")) else "folder"
    if path.endswith(".jsonl") or path.endswith(".json"):
        return "jsonl"
    if path.endswith(".tsv"):
        return "tsv"
    raise ValueError(f"cannot tell the format of {path}: expected a .jsonl or .tsv file, a Kaldi data "
                     "folder (with wav.scp) or a folder of audio; pass --format")


def read_corpus(path, corpus_format="auto"):
    """Read ``path`` in ``corpus_format`` (or detected); return (entries, rejects), duplicates rejected."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist: give a manifest file or a corpus folder")
    corpus_format = detect_format(path) if corpus_format == "auto" else corpus_format
    reader = {"jsonl": read_jsonl, "tsv": read_tsv, "kaldi": read_kaldi, "folder": read_folder}
    entries, rejects = reader[corpus_format](path)
    return reject_duplicate_keys(entries, rejects)


def sanitize_key(raw):
    """A shard-safe key: webdataset splits member names at the first dot, tar paths at '/'."""
    return re.sub(r"[^A-Za-z0-9_\-]", "_", str(raw).strip())


def reject_duplicate_keys(entries, rejects):
    """Keep the first entry of each key; later ones become ``duplicate_key`` rejects."""
    first_seen, kept = {}, []
    for entry in entries:
        if entry.key in first_seen:
            rejects.append(make_reject(entry.key, entry.origin, "duplicate_key",
                                       f"key already used at {first_seen[entry.key]}: keys must be unique"))
        else:
            first_seen[entry.key] = entry.origin
            kept.append(entry)
    return kept, rejects


def check_text(text, key, origin):
    """None when ``text`` is usable, else the reject record."""
    if not isinstance(text, str) or not text.strip():
        return make_reject(key, origin, "empty_text", "the transcript is empty or missing")
    return None


def _decoded_lines(path):
    """Yield (line number, text or None when not UTF-8) for each line of ``path``."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                yield number, None


def _resolve(base, audio):
    return audio if os.path.isabs(audio) else os.path.normpath(os.path.join(base, audio))


def _entry_from_record(record, base, origin, audio_field):
    """Entry or reject from one manifest record (a dict from a JSONL line or a TSV row)."""
    raw_key = next((record[f] for f in KEY_FIELDS if record.get(f) not in (None, "")), None)
    audio = record.get(audio_field)
    if not isinstance(audio, str) or not audio:
        return make_reject(raw_key, origin, "malformed_line", f"no '{audio_field}' field with a path")
    key = sanitize_key(raw_key if raw_key is not None else os.path.splitext(audio)[0])
    problem = check_text(record.get("text"), key, origin)
    if problem:
        return problem
    fields = {k: v for k, v in record.items() if k not in RESERVED_FIELDS and v not in (None, "")}
    return Entry(key, _resolve(base, audio), record["text"].strip(), origin, fields)


def read_jsonl(path):
    """Entries and rejects from a JSONL manifest."""
    return _read_records(path, _decoded_lines(path), _parse_json_object, "audio")


def _parse_json_object(line):
    record = json.loads(line)
    if not isinstance(record, dict):
        raise ValueError(f"not a JSON object: {line[:80]}")
    return record


def read_tsv(path):
    """Entries and rejects from a TSV manifest with a header line (``path``, ``text``, ...)."""
    lines = list(_decoded_lines(path))
    if not lines or lines[0][1] is None:
        raise ValueError(f"{path}: the first line must be a UTF-8 header naming the columns")
    header = next(csv.reader([lines[0][1]], delimiter="\t"))
    if "path" not in header or "text" not in header:
        raise ValueError(f"{path}: the header {header} lacks 'path' and 'text' columns: add them")

    def parse_row(line):
        values = next(csv.reader([line], delimiter="\t", quoting=csv.QUOTE_NONE))
        if len(values) != len(header):
            raise ValueError(f"{len(values)} columns where the header has {len(header)}")
        return dict(zip(header, values))
    return _read_records(path, lines[1:], parse_row, "path")


def _read_records(path, lines, parse, audio_field):
    """Entries and rejects from (line number, text) pairs; ``parse`` turns a line into a record dict
    or raises ValueError (a malformed line)."""
    base, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    entries, rejects = [], []
    for number, line in lines:
        origin = f"{name}:{number}"
        if line is None:
            rejects.append(make_reject(None, origin, "non_utf8_text", "the line is not valid UTF-8"))
            continue
        if not line.strip():
            continue
        try:
            record = parse(line)
        except ValueError as error:
            rejects.append(make_reject(None, origin, "malformed_line", str(error)))
            continue
        result = _entry_from_record(record, base, origin, audio_field)
        (entries if isinstance(result, Entry) else rejects).append(result)
    return entries, rejects


def _read_kaldi_table(path, rejects, required=True):
    """{first field: rest of line} from a Kaldi table file; bad lines become rejects."""
    if not os.path.isfile(path):
        if required:
            raise FileNotFoundError(f"{path} is missing: a Kaldi data folder needs wav.scp and text")
        return {}
    table, name = {}, os.path.basename(path)
    for number, line in _decoded_lines(path):
        origin = f"{name}:{number}"
        if line is None:
            rejects.append(make_reject(None, origin, "non_utf8_text", "the line is not valid UTF-8"))
        elif line.strip():
            key, _, rest = line.strip().partition(" ")
            table[key] = (rest.strip(), origin)
    return table


def read_kaldi(folder):
    """Entries and rejects from a Kaldi data folder (wav.scp, text, utt2spk, segments)."""
    rejects = []
    wav_scp = _read_kaldi_table(os.path.join(folder, "wav.scp"), rejects)
    texts = _read_kaldi_table(os.path.join(folder, "text"), rejects)
    speakers = _read_kaldi_table(os.path.join(folder, "utt2spk"), rejects, required=False)
    segments = _read_kaldi_table(os.path.join(folder, "segments"), rejects, required=False)
    utterances = segments if segments else {utt: (utt, origin) for utt, (_, origin) in wav_scp.items()}
    entries = []
    for utt, (value, origin) in utterances.items():
        result = _kaldi_entry(folder, utt, value, origin, wav_scp, texts, speakers, bool(segments))
        (entries if isinstance(result, Entry) else rejects).append(result)
    return entries, rejects


def _kaldi_entry(folder, utt, value, origin, wav_scp, texts, speakers, segmented):
    key = sanitize_key(utt)
    start_s = end_s = None
    recording = utt
    if segmented:
        parts = value.split()
        try:
            recording, start_s, end_s = parts[0], float(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            return make_reject(key, origin, "malformed_line", "segments lines are: utt rec start end")
        if end_s <= start_s:
            return make_reject(key, origin, "zero_length_audio", f"segment end {end_s} <= start {start_s}")
    if recording not in wav_scp:
        return make_reject(key, origin, "missing_audio", f"recording {recording} is not in wav.scp")
    audio = wav_scp[recording][0]
    if audio.endswith("|") or " " in audio:
        return make_reject(key, origin, "pipe_not_supported", "wav.scp commands are not run: write the "
                           "audio to files (e.g. with sox) and list their paths in wav.scp")
    if utt not in texts:
        return make_reject(key, origin, "empty_text", f"utterance {utt} has no line in text")
    problem = check_text(texts[utt][0], key, origin)
    if problem:
        return problem
    fields = {"speaker": speakers[utt][0]} if utt in speakers else {}
    return Entry(key, _resolve(folder, audio), texts[utt][0], origin, fields, start_s, end_s)


def read_folder(folder):
    """Entries and rejects from a folder of audio files with same-named .txt transcripts."""
    entries, rejects = [], []
    for audio in _audio_files(folder):
        relative = os.path.relpath(audio, folder)
        key = sanitize_key(os.path.splitext(relative)[0])
        text_path = os.path.splitext(audio)[0] + ".txt"
        if not os.path.isfile(text_path):
            rejects.append(make_reject(key, relative, "empty_text", f"no transcript {text_path}"))
            continue
        try:
            with io.open(text_path, encoding="utf-8") as handle:
                text = handle.read().strip()
        except UnicodeDecodeError:
            rejects.append(make_reject(key, relative, "non_utf8_text", f"{text_path} is not UTF-8"))
            continue
        problem = check_text(text, key, relative)
        if problem:
            rejects.append(problem)
            continue
        entries.append(Entry(key, audio, text, relative))
    return entries, rejects


def _audio_files(folder):
    """Audio files below ``folder`` in a stable (sorted) order."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        found += [os.path.join(root, f) for f in sorted(files) if f.lower().endswith(AUDIO_EXTENSIONS)]
    return found
