#!/usr/bin/env python3
"""Turn a corpus into WebDataset shards of 16 kHz mono Opus + json, with a metadata parquet.

    python local/make_shards.py INPUT OUT_DIR [--format auto|jsonl|tsv|wenet|commonvoice|kaldi|librispeech|folder]
        [--jobs N] [--shard-size MB] [--max-duration S] [--prefix P]
        [--audio-field F] [--text-field F] [--id-field F] [--speaker-field F] [--unlabelled] [--bitrate KBPS]

INPUT is a .jsonl or .tsv manifest, a WeNet / CosyVoice data.list, a Common Voice TSV (clips/ beside
it), a Kaldi data folder, a LibriSpeech-style folder, a folder of audio with .txt transcripts or a Hugging
Face dataset saved as parquet (audio bytes extracted once to OUT_DIR/.parts/audio), detected
from the input (see common/corpora/readers.py); the --*-field options name a manifest's fields.
With --unlabelled, audio without a transcript (a folder of audio alone, a manifest without a text field,
a Kaldi folder without ``text``) is kept with a null text: shards for pretraining, which the finetune
loader refuses.
OUT_DIR receives {prefix}-000000.tar ..., metadata_pool.parquet,
metadata_core.parquet (the filtered subset), rejects.jsonl (every entry left out, with its reason) and
summary.json.

Encoding runs in --jobs processes; the main process appends the encoded samples, in input order, to
the current shard and starts a new one when the next sample would pass --shard-size. A shard is
written as a temporary file and renamed when complete, then its sidecar (.parts/NAME.json: its rows,
its rejects and the input position it reaches) is written. A rerun of the same command keeps every
shard that has a sidecar and continues from the position the last one reached, so a run killed at
any point ends with exactly the samples of an uninterrupted run.

Exit status: 0 when the run completes (even with rejects); 1 when no entry could be used; 2 on a usage
error (missing input, output folder of another corpus).
"""

import argparse
import collections
import glob
import hashlib
import json
import logging
import os
import sys
import time

import soundfile as sf
from tqdm import tqdm

from common.atomic import atomic_write_text
from common.audio_io import OPUS_KBPS_RANGE, SAMPLE_RATE, AudioError, encode_opus, read_audio, read_audio_command
from common.corpora.readers import FORMATS, make_reject, read_corpus
from common.parallel import process_pool
from common.shard_format import (
    CORE_PARQUET,
    POOL_PARQUET,
    SHARD_NAME_FORMAT,
    ShardWriter,
    metadata_row,
    sample_json,
    write_metadata,
)
from common.user_errors import run_command

logger = logging.getLogger("make_shards")
PARTS = ".parts"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Turn a corpus into WebDataset shards (16 kHz mono Opus + json) and a metadata "
        "parquet. Rerunning the same command resumes.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("input", help="a .jsonl or .tsv manifest, a WeNet / CosyVoice data.list, a Common "
                        "Voice TSV (clips/ beside it), a Kaldi data folder, a LibriSpeech-style folder, a folder "
                        "of audio files with same-named .txt transcripts, or a Hugging Face dataset saved as "
                        "parquet (a .parquet file or a folder of them)")
    parser.add_argument("out_dir", help="folder for the shards and parquets (created)")
    parser.add_argument("--format", default="auto", choices=("auto",) + FORMATS,
                        help="input layout; auto detects it from INPUT")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="encoding processes")
    parser.add_argument("--shard-size", type=float, default=256.0, help="largest shard, in MB")
    parser.add_argument("--max-duration", type=float, default=60.0,
                        help="longer audio (seconds) is rejected as too_long")
    parser.add_argument("--prefix", default="shard", help="shard file names are PREFIX-000000.tar")
    parser.add_argument("--rebuild", action="store_true", help="when OUT_DIR holds shards of another input "
                        "(an edited manifest, other options), replace them instead of stopping (exit 2)")
    parser.add_argument("--allow-pipes", action="store_true", help="run Kaldi wav.scp commands ('... |') "
                        "through the shell to read their audio (only for a wav.scp you trust)")
    parser.add_argument("--pipe-timeout", type=float, default=60.0, help="seconds a wav.scp command may run")
    parser.add_argument("--bitrate", type=float, help="Opus encoder bitrate in kbit/s (6-256, VBR); default: "
                        "libsndfile's (~26 for 16 kHz speech). 16 kHz mono Opus inputs are copied as they are")
    parser.add_argument("--unlabelled", action="store_true", help="keep audio without a transcript (null "
                        "text; for pretraining) instead of rejecting it as empty_text")
    fields = parser.add_argument_group("a manifest's field (JSON key, TSV column) names; default: the layout's")
    for name, example in (("audio", "wav"), ("text", "sentence"), ("id", "utt_id"), ("speaker", "client_id")):
        fields.add_argument(f"--{name}-field", help=f"e.g. {example}")
    core = parser.add_argument_group("metadata_core.parquet: the subset of samples that pass all of")
    core.add_argument("--core-min-duration", type=float, default=0.5, help="seconds")
    core.add_argument("--core-max-duration", type=float, default=30.0, help="seconds")
    core.add_argument("--core-min-cps", type=float, default=1.0, help="characters per second")
    core.add_argument("--core-max-cps", type=float, default=30.0, help="characters per second")
    core.add_argument("--core-keys", help="a file of sample keys, one a line, to keep (others dropped)")
    return parser.parse_args(argv)


def encode_entry(entry, max_duration_s, pipe_timeout_s=60.0, bitrate_kbps=None):
    """Worker: read, resample, encode one entry. Returns (key, opus, json bytes, seconds, source rate)
    or a reject. A whole file that is already 16 kHz mono Ogg Opus is decoded (to check it) and its
    bytes copied: no second lossy encoding. A piped entry's command is run (``pipe_timeout_s``)."""
    try:
        if entry.pipe:
            audio, rate = read_audio_command(entry.audio, pipe_timeout_s, entry.start_s, entry.end_s,
                                             max_duration_s=max_duration_s)
            copyable = False
        else:
            audio = read_audio(entry.audio, entry.start_s, entry.end_s, max_duration_s=max_duration_s)
            rate, copyable = source_format(entry)
        opus = read_bytes(entry.audio) if copyable else encode_opus(audio, bitrate_kbps=bitrate_kbps)
    except AudioError as error:
        return make_reject(entry.key, entry.origin, error.reason, str(error))
    except Exception as error:  # noqa: BLE001 - one strange file must not stop the corpus
        return make_reject(entry.key, entry.origin, "undecodable_audio", f"{entry.audio}: {error!r}")
    duration = len(audio) / SAMPLE_RATE
    sample = sample_json(entry.text, duration, entry.source(), entry.fields)
    return entry.key, opus, json.dumps(sample, ensure_ascii=False).encode("utf-8"), duration, rate


def source_format(entry):
    """``(sample rate, whether its bytes can go into the shard as they are)``: a whole (unsegmented)
    16 kHz mono Ogg Opus file can."""
    info = sf.info(entry.audio)
    copyable = (entry.start_s is None and info.format == "OGG" and info.subtype == "OPUS"
                and info.samplerate == SAMPLE_RATE and info.channels == 1)
    return info.samplerate, copyable


def read_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


class ShardAssembler:
    """Appends encoded samples to numbered shards, sealing each one atomically with its sidecar."""

    def __init__(self, out_dir, prefix, max_bytes, first_index):
        self.out_dir, self.prefix, self.max_bytes = out_dir, prefix, max_bytes
        self.index, self.writer, self.rows, self.rejects = first_index, None, [], []
        self.sealed = []

    def add(self, entry_index, key, opus, json_bytes):
        needed = ShardWriter.bytes_needed(key, opus, json_bytes)
        if self.writer and self.writer.samples and self.writer.size + needed > self.max_bytes:
            self.seal(end_entry=entry_index)
        if self.writer is None:
            self.writer = ShardWriter(self._path(self.index) + ".tmp")
        offsets = self.writer.add(key, opus, json_bytes)
        self.rows.append(metadata_row(key, json.loads(json_bytes), self._name(self.index), offsets))

    def reject(self, record):
        self.rejects.append(record)

    def seal(self, end_entry):
        """Close the open shard: rename the tar, then write the sidecar that marks it complete."""
        if self.writer is None:
            return
        self.writer.close()
        os.replace(self.writer.path, self._path(self.index))
        sidecar = {"shard_name": self._name(self.index), "end_entry": end_entry,
                   "rows": self.rows, "rejects": self.rejects}
        atomic_write_text(sidecar_path(self.out_dir, self._name(self.index)), json.dumps(sidecar))
        self.sealed.append(sidecar)
        self.index, self.writer, self.rows, self.rejects = self.index + 1, None, [], []

    def _name(self, index):
        return SHARD_NAME_FORMAT.format(prefix=self.prefix, index=index)

    def _path(self, index):
        return os.path.join(self.out_dir, self._name(index))


def sidecar_path(out_dir, shard_name):
    return os.path.join(out_dir, PARTS, shard_name + ".json")


def input_fingerprint(entries, args):
    """A hash of everything that decides the shards' content, to refuse mixing two inputs in one folder."""
    digest = hashlib.sha256()
    for entry in entries:
        described = [entry.key, entry.audio, entry.text, entry.start_s, entry.end_s, entry.fields]
        described += [entry.audio_sha256] if entry.audio_sha256 else []  # a parquet's bytes: same path, new audio
        digest.update(json.dumps(described, sort_keys=True).encode())
    digest.update(json.dumps([args.prefix, args.shard_size, args.max_duration]
                             + (["unlabelled"] if args.unlabelled else [])
                             + ([args.bitrate] if args.bitrate is not None else [])).encode())
    return digest.hexdigest()


def load_sealed(out_dir, prefix, fingerprint, rebuild=False):
    """The sidecars of the shards a previous run completed (contiguous from 0), after checking that
    the folder belongs to this input (``rebuild``: when it does not, remove what an earlier run wrote
    and start over); stale temporary files are removed."""
    os.makedirs(os.path.join(out_dir, PARTS), exist_ok=True)
    plan_path = os.path.join(out_dir, PARTS, "input.sha256")
    if os.path.isfile(plan_path) and open(plan_path).read().strip() != fingerprint:
        if not rebuild:
            fail(f"{out_dir} holds shards of another input or other options: give a new OUT_DIR, delete "
                 "this one, or pass --rebuild to replace them", status=2)
        logger.warning("%s holds shards of another input or other options (the manifest changed?): "
                       "removing them and sharding again", out_dir)
        remove_outputs(out_dir, prefix)
    atomic_write_text(plan_path, fingerprint)
    for stale in glob.glob(os.path.join(out_dir, "*.tmp")):
        os.remove(stale)
    sealed = []
    while True:
        name = SHARD_NAME_FORMAT.format(prefix=prefix, index=len(sealed))
        path = sidecar_path(out_dir, name)
        if not (os.path.isfile(path) and os.path.isfile(os.path.join(out_dir, name))):
            return sealed
        with open(path, encoding="utf-8") as handle:
            sealed.append(json.load(handle))


def remove_outputs(out_dir, prefix):
    """Delete what make_shards wrote in ``out_dir`` for ``prefix`` (shards, sidecars, parquets, reports)."""
    written = glob.glob(os.path.join(out_dir, glob.escape(prefix) + "-*.tar"))
    written += glob.glob(os.path.join(out_dir, PARTS, "*"))
    written += [os.path.join(out_dir, name) for name in (POOL_PARQUET, CORE_PARQUET, "rejects.jsonl", "summary.json")]
    for path in written:
        if os.path.isfile(path):
            os.remove(path)


def encode_all(entries, args, assembler, start):
    """Encode entries[start:] in parallel and feed them, in order, to the assembler; returns how many
    kept inputs had each sample rate below 16 kHz (``{rate: count}``), warned about once."""
    jobs = [(entry, args.max_duration, args.pipe_timeout, args.bitrate) for entry in entries[start:]]
    low_rates = collections.Counter()
    with process_pool(args.jobs) as pool:
        results = pool.imap(_encode_job, jobs, chunksize=4)
        for offset, result in enumerate(tqdm(results, total=len(jobs), unit="utt", desc="encoding",
                                             disable=None)):
            if isinstance(result, dict):
                assembler.reject(result)
                continue
            assembler.add(start + offset, *result[:3])
            if result[4] < SAMPLE_RATE:
                low_rates[int(result[4])] += 1
    assembler.seal(end_entry=len(entries))
    if low_rates:
        logger.warning("inputs below 16 kHz (upsampled: no content above half their rate): %s",
                       ", ".join(f"{count} at {rate} Hz" for rate, count in sorted(low_rates.items())))
    return dict(sorted(low_rates.items()))


def _encode_job(job):
    return encode_entry(*job)


def select_core(rows, args, keep_keys=None):
    """The rows that pass the core filters: duration and characters-per-second bounds, a key list."""
    def passes(row):
        cps_ok = row["text"] is None or args.core_min_cps <= len(row["text"]) / row["duration"] <= args.core_max_cps
        return (args.core_min_duration <= row["duration"] <= args.core_max_duration and cps_ok
                and (keep_keys is None or row["sample_key"] in keep_keys))
    return [row for row in rows if passes(row)]


def write_outputs(out_dir, sealed, rejects, args, last_run):
    """Write the pool and core parquets, rejects.jsonl and summary.json from the sealed shards;
    ``last_run`` (this run's encoding figures) goes into the summary as it is."""
    rows = [row for sidecar in sealed for row in sidecar["rows"]]
    keep_keys = None
    if args.core_keys:
        with open(args.core_keys, encoding="utf-8") as handle:
            keep_keys = {line.strip() for line in handle if line.strip()}
    core = select_core(rows, args, keep_keys)
    write_metadata(rows, os.path.join(out_dir, POOL_PARQUET), unlabelled=args.unlabelled)
    write_metadata(core, os.path.join(out_dir, CORE_PARQUET), unlabelled=args.unlabelled)
    atomic_write_text(os.path.join(out_dir, "rejects.jsonl"),
                      "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejects))
    summary = {"kept": len(rows), "core": len(core), "untranscribed": sum(row["text"] is None for row in rows),
               "rejected": len(rejects),
               "rejected_by_reason": dict(collections.Counter(r["reason"] for r in rejects)),
               "hours": sum(r["duration"] for r in rows) / 3600, "shards": len(sealed),
               "last_run": last_run}
    atomic_write_text(os.path.join(out_dir, "summary.json"), json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.bitrate is not None and not OPUS_KBPS_RANGE[0] <= args.bitrate <= OPUS_KBPS_RANGE[1]:
        fail(f"--bitrate {args.bitrate:g}: Opus takes {OPUS_KBPS_RANGE[0]:g}-{OPUS_KBPS_RANGE[1]:g} kbit/s", status=2)
    try:
        entries, read_rejects = read_corpus(args.input, args.format, text_required=not args.unlabelled,
                                            allow_pipes=args.allow_pipes,
                                            extract_dir=os.path.join(args.out_dir, PARTS, "audio"),
                                            audio=args.audio_field, text=args.text_field, key=args.id_field,
                                            speaker=args.speaker_field)
    except (FileNotFoundError, ValueError) as error:
        fail(str(error), status=2)
    os.makedirs(args.out_dir, exist_ok=True)
    sealed = load_sealed(args.out_dir, args.prefix, input_fingerprint(entries, args), args.rebuild)
    start = sealed[-1]["end_entry"] if sealed else 0
    if sealed:
        logger.info("resuming: %d shards complete, %d of %d entries left", len(sealed),
                    len(entries) - start, len(entries))
    assembler = ShardAssembler(args.out_dir, args.prefix, int(args.shard_size * 1e6), len(sealed))
    began = time.time()
    low_rates = encode_all(entries, args, assembler, start)
    sealed += assembler.sealed
    last_run = {"jobs": args.jobs, "encode_wall_s": round(time.time() - began, 3),
                "encoded_audio_s": sum(row["duration"] for sidecar in assembler.sealed
                                       for row in sidecar["rows"]),
                "inputs_below_16k_by_rate": {str(rate): count for rate, count in low_rates.items()}}
    rejects = read_rejects + [r for sidecar in sealed for r in sidecar["rejects"]] + assembler.rejects
    summary = write_outputs(args.out_dir, sealed, rejects, args, last_run)
    report(summary)
    if summary["kept"] == 0:
        fail(f"no usable sample in {args.input}: {summary['rejected_by_reason'] or 'no entries found'} "
             f"(see {os.path.join(args.out_dir, 'rejects.jsonl')})", status=1)


def fail(message, status):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def report(summary):
    logger.info("kept %d samples (%.2f h; %d without transcript) in %d shards; core %d; rejected %d %s",
                summary["kept"], summary["hours"], summary["untranscribed"], summary["shards"], summary["core"],
                summary["rejected"], summary["rejected_by_reason"] or "")
    run = summary["last_run"]
    logger.info("this run encoded %.0f s of audio in %.1f s: %.1fx realtime with %d jobs",
                run["encoded_audio_s"], run["encode_wall_s"],
                run["encoded_audio_s"] / max(run["encode_wall_s"], 1e-9), run["jobs"])


if __name__ == "__main__":
    run_command(main)
