"""Read a user's corpus into entries (key, audio path, text, carried fields) and rejects.

Eight layouts are understood, detected from the input (``detect_format``) or named; each reader returns
``(entries, rejects)`` and never raises on a bad line: the line becomes a reject with a reason, so one
broken entry never costs the rest of the corpus.

- ``jsonl``: one JSON object a line with ``audio`` and ``text`` (optional ``id``/``key``, ``speaker``,
  ``lang``, ``duration``; any other field is carried into the sample's json).
- ``wenet``: a WeNet / CosyVoice ``data.list``, JSON lines with ``key``, ``wav`` and ``txt``.
- ``tsv``: a header line naming the columns, at least ``path`` and ``text``.
- ``commonvoice``: a Common Voice TSV (``client_id``, ``path``, ``sentence``, ...), audio in ``clips/``.
- ``kaldi``: a folder with ``wav.scp`` (commands ``... |`` only with ``allow_pipes``), ``text``, optional
  ``utt2spk`` and ``segments``.
- ``librispeech``: ``SPEAKER/CHAPTER/SPEAKER-CHAPTER.trans.txt`` files beside their audio.
- ``folder``: audio files (wav / flac / ogg / opus / mp3) under a folder, each with a same-named ``.txt``.
- ``hfparquet``: a Hugging Face dataset saved as parquet (a ``.parquet`` file or a folder of them), the
  audio a struct of ``bytes`` / ``path`` (``common/corpora/hf_parquet.py``; bytes written once to ``extract_dir``).

A manifest's field names can be given (``read_corpus(..., audio="file", text="words", key="uid",
speaker="who")``; make_shards' ``--audio-field`` ...).
Relative audio paths resolve against the manifest's folder. With ``text_required=False`` (audio to
transcribe, speech nobody transcribed) an entry without a transcript is kept with ``text`` None.
"""

import csv
import dataclasses
import io
import json
import os
import re
import tempfile

from common.corpora import hf_parquet

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".opus", ".mp3")
FORMATS = ("jsonl", "tsv", "kaldi", "folder", "wenet", "commonvoice", "librispeech", "hfparquet")
KEY_FIELDS = ("id", "key", "utt_id")
RESERVED_FIELDS = {"audio", "path", "text", "duration", *KEY_FIELDS}


@dataclasses.dataclass
class Entry:
    """One utterance to shard: ``start_s``/``end_s`` select a segment (Kaldi ``segments``)."""
    key: str
    audio: str
    text: str | None  # None: no transcript (read with text_required=False)
    origin: str  # where it was read: "train.jsonl:12"
    fields: dict = dataclasses.field(default_factory=dict)
    start_s: float | None = None
    end_s: float | None = None
    pipe: bool = False  # ``audio`` is a shell command writing the audio to stdout (Kaldi wav.scp)
    audio_sha256: str | None = None  # the content's hash where the path does not name it (parquet bytes)

    def source(self):
        """The audio this sample came from, as stored in its json (segment bounds appended)."""
        if self.start_s is None:
            return self.audio
        return f"{self.audio}#{self.start_s:.3f}-{self.end_s:.3f}"


def make_reject(key, origin, reason, detail):
    """A rejects-file record: the entry's key (or None), where it was read, why, and what to do."""
    return {"key": key, "origin": origin, "reason": reason, "detail": detail}


def detect_format(path):
    """Name the layout of ``path`` from its extension, its first line or its folder's contents."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "wav.scp")):
            return "kaldi"
        if librispeech_transcripts(path):
            return "librispeech"
        return "hfparquet" if hf_parquet.holds_hf_parquet(path) else "folder"
    if path.endswith(".parquet"):
        return "hfparquet"
    readable = os.path.isfile(path)  # a file to be written later is named by its extension alone
    if path.endswith(".jsonl") or path.endswith(".json") or path.endswith(".list"):
        return "wenet" if readable and _first_record_has(path, ("wav", "txt")) else "jsonl"
    if path.endswith(".tsv"):
        return "commonvoice" if readable and {"client_id", "path", "sentence"} <= set(tsv_header(path)) else "tsv"
    raise ValueError(f"cannot tell the format of {path}: expected a .jsonl / .list / .tsv file, a Kaldi "
                     "data folder (with wav.scp), a LibriSpeech-style folder, a folder of audio or a Hugging "
                     "Face .parquet; pass --format")


def _first_record_has(path, keys):
    """Whether the first non-empty line of a JSON-lines file is an object with all of ``keys``."""
    for _, line in _decoded_lines(path):
        if line and line.strip():
            try:
                record = json.loads(line)
            except ValueError:
                return False
            return isinstance(record, dict) and all(key in record for key in keys)
    return False


def read_corpus(path, corpus_format="auto", text_required=True, allow_pipes=False, extract_dir=None,
                **field_names):
    """Read ``path`` in ``corpus_format`` (or detected); return (entries, rejects), duplicates rejected.
    ``text_required=False`` keeps entries without a transcript (``text`` None) instead of rejecting them;
    ``allow_pipes`` keeps Kaldi ``wav.scp`` commands (``... |``) as piped entries; ``extract_dir``: where
    a Hugging Face parquet's audio bytes are written (default: a new temporary folder); ``field_names``
    (``audio``, ``text``, ``key``, ``speaker``) rename a manifest's fields."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist: give a manifest file or a corpus folder")
    corpus_format = detect_format(path) if corpus_format == "auto" else corpus_format
    if corpus_format == "hfparquet":
        fields = Fields().with_overrides(**field_names)
        entries, rejects = read_hf_parquet(path, text_required, fields, extract_dir or tempfile.mkdtemp())
    elif corpus_format in LAYOUT_FIELDS:
        fields = LAYOUT_FIELDS[corpus_format].with_overrides(**field_names)
        reader = read_tsv if corpus_format in ("tsv", "commonvoice") else read_jsonl
        entries, rejects = reader(path, text_required, fields)
    elif any(field_names.values()):
        raise ValueError(f"--audio-field / --text-field / --id-field / --speaker-field name the fields of a "
                         f"manifest; {path} is a {corpus_format} folder")
    elif corpus_format == "kaldi":
        entries, rejects = read_kaldi(path, text_required, allow_pipes)
    else:
        entries, rejects = {"folder": read_folder, "librispeech": read_librispeech}[corpus_format](path, text_required)
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
    if not has_text(text):
        return make_reject(key, origin, "empty_text", "the transcript is empty or missing")
    return None


def has_text(text):
    return isinstance(text, str) and bool(text.strip())


def transcript(text, key, origin, text_required):
    """``(text, reject)``: the stripped transcript, None when it is missing and not required, or the
    reject record when it is missing and required."""
    if has_text(text):
        return text.strip(), None
    return None, (check_text(text, key, origin) if text_required else None)


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


@dataclasses.dataclass(frozen=True)
class Fields:
    """Which record fields (JSON keys, TSV columns) hold the audio path, transcript, key and speaker;
    ``audio_dir``: a folder the audio paths are relative to, below the manifest's (Common Voice: clips)."""
    audio: str = "audio"
    text: str = "text"
    key: tuple = KEY_FIELDS
    speaker: str = "speaker"
    audio_dir: str = ""

    def with_overrides(self, audio=None, text=None, key=None, speaker=None):
        """These fields with the user's names (``--audio-field`` ...) where given."""
        given = {"audio": audio, "text": text, "key": (key,) if key else None, "speaker": speaker}
        return dataclasses.replace(self, **{name: value for name, value in given.items() if value})


# The field names of each manifest layout.
LAYOUT_FIELDS = {
    "jsonl": Fields(),
    "tsv": Fields(audio="path"),
    "wenet": Fields(audio="wav", text="txt", key=("key",)),  # WeNet / CosyVoice data.list
    "commonvoice": Fields(audio="path", text="sentence", key=(), speaker="client_id", audio_dir="clips"),
}


def _entry_from_record(record, base, origin, fields, text_required=True):
    """Entry or reject from one manifest record (a dict from a JSONL line or a TSV row)."""
    raw_key = next((record[f] for f in fields.key if record.get(f) not in (None, "")), None)
    audio = record.get(fields.audio)
    if not isinstance(audio, str) or not audio:
        return make_reject(raw_key, origin, "malformed_line", f"no '{fields.audio}' field with a path")
    audio_base = os.path.join(base, fields.audio_dir)
    resolved = _resolve(audio_base, audio)
    key = sanitize_key(raw_key if raw_key is not None else key_of_path(resolved, audio_base))
    text, problem = transcript(record.get(fields.text), key, origin, text_required)
    if problem:
        return problem
    used = {fields.audio, fields.text, fields.speaker, *fields.key, *RESERVED_FIELDS}
    carried = {k: v for k, v in record.items() if k not in used and v not in (None, "")}
    if record.get(fields.speaker) not in (None, ""):
        carried["speaker"] = record[fields.speaker]
    return Entry(key, resolved, text, origin, carried)


def read_hf_parquet(path, text_required, fields, extract_dir):
    """Entries and rejects from a Hugging Face parquet dataset (``common/corpora/hf_parquet.py``)."""
    files = hf_parquet.parquet_files(path)
    if not files:
        raise FileNotFoundError(f"no .parquet file in {path}")
    audio, text, keys, speaker = hf_parquet.column_names(files[0], fields)
    if text is None and text_required:
        raise ValueError(f"{files[0]} has no transcript column (none of {hf_parquet.TEXT_COLUMNS}): pass "
                         "--text-field, or --unlabelled for untranscribed speech")
    fields = dataclasses.replace(fields, audio=audio, text=text or "", key=keys + (hf_parquet.EXTRACTED_KEY,),
                                 speaker=speaker or "")
    entries, rejects = [], []
    for origin, base, record, digest in hf_parquet.iter_records(files, audio, keys, extract_dir):
        result = _entry_from_record(record, base, origin, fields, text_required)
        if isinstance(result, Entry):
            result.audio_sha256 = digest
            entries.append(result)
        else:
            rejects.append(result)
    return entries, rejects


def key_of_path(path, base):
    """The key of an id-less manifest line: its audio path relative to the manifest's folder (Common
    Voice: its clips folder), without the extension (``wav/a.flac`` -> ``wav_a``); the file's stem
    when the audio lies outside that folder. Keys so do not depend on where the corpus sits."""
    relative = os.path.relpath(path, base)
    if relative.startswith(os.pardir + os.sep) or os.path.isabs(relative):
        relative = os.path.basename(path)
    return os.path.splitext(relative)[0]


def read_jsonl(path, text_required=True, fields=None):
    """Entries and rejects from a JSONL manifest (a WeNet data.list is one with other field names)."""
    return _read_records(path, _decoded_lines(path), _parse_json_object, fields or LAYOUT_FIELDS["jsonl"],
                         text_required)


def read_wenet(path, text_required=True, fields=None):
    """Entries and rejects from a WeNet / CosyVoice ``data.list``: a JSON object a line with ``key``,
    ``wav`` and ``txt``."""
    return read_jsonl(path, text_required, fields or LAYOUT_FIELDS["wenet"])


def _parse_json_object(line):
    record = json.loads(line)
    if not isinstance(record, dict):
        raise ValueError(f"not a JSON object: {line[:80]}")
    return record


def tsv_header(path):
    """The column names of a TSV manifest's first line."""
    with open(path, "rb") as handle:
        first = handle.readline()
    try:
        return next(csv.reader([first.decode("utf-8").rstrip("\r\n")], delimiter="\t"), [])
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: the first line must be a UTF-8 header naming the columns") from error


def read_tsv(path, text_required=True, fields=None):
    """Entries and rejects from a TSV manifest with a header line (``path``, ``text``, ...)."""
    fields = fields or LAYOUT_FIELDS["tsv"]
    lines = list(_decoded_lines(path))
    if not lines or lines[0][1] is None:
        raise ValueError(f"{path}: the first line must be a UTF-8 header naming the columns")
    header = next(csv.reader([lines[0][1]], delimiter="\t"))
    needed = (fields.audio, fields.text) if text_required else (fields.audio,)
    if any(column not in header for column in needed):
        names = " and ".join(repr(column) for column in needed)
        raise ValueError(f"{path}: the header {header} lacks {names} columns: add them, or name the columns "
                         "with --audio-field / --text-field")

    def parse_row(line):
        values = next(csv.reader([line], delimiter="\t", quoting=csv.QUOTE_NONE))
        if len(values) != len(header):
            raise ValueError(f"{len(values)} columns where the header has {len(header)}")
        return dict(zip(header, values))
    return _read_records(path, lines[1:], parse_row, fields, text_required)


def read_commonvoice(path, text_required=True, fields=None):
    """Entries and rejects from a Common Voice TSV (``client_id``, ``path``, ``sentence``, ...; the
    audio in ``clips/`` beside it; the speaker is the ``client_id``)."""
    return read_tsv(path, text_required, fields or LAYOUT_FIELDS["commonvoice"])


def _read_records(path, lines, parse, fields, text_required=True):
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
        result = _entry_from_record(record, base, origin, fields, text_required)
        (entries if isinstance(result, Entry) else rejects).append(result)
    return entries, rejects


def _read_kaldi_table(path, rejects, required=True):
    """{first field: rest of line} from a Kaldi table file; bad lines become rejects."""
    if not os.path.isfile(path):
        if required:
            hint = " (untranscribed speech: make_shards.py --unlabelled)" if path.endswith("text") else ""
            raise FileNotFoundError(f"{path} is missing: a Kaldi data folder needs wav.scp and text{hint}")
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


def read_kaldi(folder, text_required=True, allow_pipes=False):
    """Entries and rejects from a Kaldi data folder (wav.scp, text, utt2spk, segments)."""
    rejects = []
    wav_scp = _read_kaldi_table(os.path.join(folder, "wav.scp"), rejects)
    texts = _read_kaldi_table(os.path.join(folder, "text"), rejects, required=text_required)
    speakers = _read_kaldi_table(os.path.join(folder, "utt2spk"), rejects, required=False)
    segments = _read_kaldi_table(os.path.join(folder, "segments"), rejects, required=False)
    utterances = segments if segments else {utt: (utt, origin) for utt, (_, origin) in wav_scp.items()}
    entries = []
    for utt, (value, origin) in utterances.items():
        result = _kaldi_entry(folder, utt, value, origin, wav_scp, texts, speakers, bool(segments), text_required,
                              allow_pipes)
        (entries if isinstance(result, Entry) else rejects).append(result)
    return entries, rejects


def _kaldi_entry(folder, utt, value, origin, wav_scp, texts, speakers, segmented, text_required=True,
                 allow_pipes=False):
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
    pipe = audio.endswith("|")
    if pipe and not allow_pipes:
        return make_reject(key, origin, "pipe_not_supported", "wav.scp commands are not run: pass "
                           "--allow-pipes to run them, or write the audio to files (e.g. with sox)")
    if " " in audio and not pipe:
        return make_reject(key, origin, "malformed_line", "a wav.scp path with spaces, or a command "
                           "without its final '|'")
    if utt not in texts and text_required:
        return make_reject(key, origin, "empty_text", f"utterance {utt} has no line in text")
    text, problem = transcript(texts.get(utt, (None,))[0], key, origin, text_required)
    if problem:
        return problem
    fields = {"speaker": speakers[utt][0]} if utt in speakers else {}
    if pipe:
        return Entry(key, audio[:-1].strip(), text, origin, fields, start_s, end_s, pipe=True)
    return Entry(key, _resolve(folder, audio), text, origin, fields, start_s, end_s)


def read_folder(folder, text_required=True):
    """Entries and rejects from a folder of audio files with same-named .txt transcripts."""
    entries, rejects = [], []
    for audio in audio_files(folder):
        relative = os.path.relpath(audio, folder)
        key = sanitize_key(os.path.splitext(relative)[0])
        text_path = os.path.splitext(audio)[0] + ".txt"
        if not os.path.isfile(text_path):
            if text_required:
                rejects.append(make_reject(key, relative, "empty_text", f"no transcript {text_path}"))
            else:
                entries.append(Entry(key, audio, None, relative))
            continue
        try:
            with io.open(text_path, encoding="utf-8") as handle:
                text = handle.read().strip()
        except UnicodeDecodeError:
            rejects.append(make_reject(key, relative, "non_utf8_text", f"{text_path} is not UTF-8"))
            continue
        text, problem = transcript(text, key, relative, text_required)
        if problem:
            rejects.append(problem)
            continue
        entries.append(Entry(key, audio, text, relative))
    return entries, rejects


def audio_files(folder):
    """Audio files below ``folder`` in a stable (sorted) order."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        found += [os.path.join(root, f) for f in sorted(files) if f.lower().endswith(AUDIO_EXTENSIONS)]
    return found


def librispeech_transcripts(folder):
    """The ``SPEAKER/CHAPTER/SPEAKER-CHAPTER.trans.txt`` files below ``folder`` (sorted)."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        found += [os.path.join(root, name) for name in sorted(files) if name.endswith(".trans.txt")]
    return found


def read_librispeech(folder, text_required=True):
    """Entries and rejects from a LibriSpeech-style folder: each ``*.trans.txt`` lists ``UTT text`` lines
    for the audio ``UTT.flac`` (or .wav ...) beside it; the speaker is the first part of ``UTT``."""
    entries, rejects = [], []
    for listing in librispeech_transcripts(folder):
        directory = os.path.dirname(listing)
        for number, line in _decoded_lines(listing):
            origin = f"{os.path.relpath(listing, folder)}:{number}"
            if line is None:
                rejects.append(make_reject(None, origin, "non_utf8_text", "the line is not valid UTF-8"))
                continue
            utt, _, text = line.strip().partition(" ")
            if not utt:
                continue
            audio = _audio_beside(directory, utt)
            text, problem = transcript(text, sanitize_key(utt), origin, text_required)
            if problem:
                rejects.append(problem)
                continue
            entries.append(Entry(sanitize_key(utt), audio, text, origin, {"speaker": utt.split("-")[0]}))
    return entries, rejects


def _audio_beside(directory, stem):
    """``directory/stem.EXT`` for the first audio extension that exists (``.flac`` when none does:
    reading it then names the missing file)."""
    candidates = [os.path.join(directory, stem + ext) for ext in AUDIO_EXTENSIONS]
    return next((path for path in candidates if os.path.isfile(path)), os.path.join(directory, stem + ".flac"))
