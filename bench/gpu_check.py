#!/usr/bin/env python3
"""GPU check: a few hundred training steps of the real finetune config on generated shards.

    python bench/gpu_check.py [--steps 300] [--out DIR] [--json] [-- --key=value ...]
    python bench/gpu_check.py --device cpu --steps 5    # smoke run of the whole path, tiny model

Stages: synthesize speech-like audio (harmonics of a gliding pitch under two formant
peaks, noise bursts, pauses; 2-20 s, lognormal lengths; no espeak-ng) with pseudo-word transcripts
-> ``local/make_shards.py`` -> ``local/train_tokenizer.py`` -> the ASR Brain of
``recipes/finetune/train.py`` built as its ``main()`` builds it, from
``recipes/finetune/hparams/conformer.yaml`` through the real config loader (bf16, the real speech
loader with the config's workers and speed perturbation), trained for ``--steps`` updates (at most
``--max-train-seconds``) without validation or test. A rerun reuses the prepared data. Arguments
after ``--`` are further config overrides or run options.

Printed at the end: step time (median, mean; the first ``--untimed-steps`` are left out), utterances
and audio seconds per second, the same audio rate with the data waits removed (the compute-bound
baseline) and their ratio, mean GPU utilisation (nvidia-smi, polled every 500 ms), peak GPU memory
allocated by torch, and the share of wall time spent waiting for the next batch (all steps, and
without the first batch of each epoch, whose wait includes starting the loader's workers: a small
corpus has an epoch start every few dozen steps, a real one every few thousand).
"""

import argparse
import functools
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import soundfile as sf
import torch

from common.atomic import atomic_write_text
from common.audio_io import SAMPLE_RATE
from common.parallel import process_pool
from recipes.finetune import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

logger = logging.getLogger("gpu_check")


class CheckError(RuntimeError):
    """A reason the check cannot run or measure; the message says what to change."""


CONFIG = os.path.join("recipes", "finetune", "hparams", "conformer.yaml")
# --device cpu checks the path, not the speed: a model that trains a step in seconds on a CPU.
CPU_SMOKE_OVERRIDES = ["--precision=fp32", "--d_model=64", "--nhead=2", "--num_encoder_layers=2",
                       "--num_decoder_layers=1", "--d_ffn=128", "--max_batch_seconds=60.0",
                       "--train_loader={max_batch_size: 8}", "--num_workers=2",
                       "--attention_type=regularMHA"]
CONSONANTS = "b d f g h k l m n p r s t v w z ch sh th".split()
VOWELS = "a e i o u ai ea ou".split()


def parse_args(argv):
    """Options before ``--``; what follows it is returned as ``overrides`` for train.py."""
    argv = list(argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="training updates to run (300)")
    parser.add_argument("--untimed-steps", type=int, default=20,
                        help="first updates left out of the figures (CUDA start-up, allocator "
                             "growth); at most half of --steps (20)")
    parser.add_argument("--max-train-seconds", type=float, default=240.0,
                        help="stop training after this long even if --steps are not done (240)")
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "out", "gpu_check"),
                        help="working folder: corpus, shards, tokenizer, experiment "
                             "(bench/out/gpu_check)")
    parser.add_argument("--device", default="cuda:0",
                        help="torch device (cuda:0); cpu trains a tiny model in fp32 "
                             "(CPU_SMOKE_OVERRIDES)")
    parser.add_argument("--utterances", type=int, help="synthetic utterances (2000; cpu: 48)")
    parser.add_argument("--vocab-size", type=int, help="unigram pieces (5000; cpu: 200)")
    parser.add_argument("--shard-mb", type=float, help="shard size in MB (1.0; cpu: 0.2)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                        help="processes for synthesis and shard encoding (the usable cores)")
    parser.add_argument("--seed", type=int, default=1234, help="corpus seed (1234)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args(argv)
    cpu = args.device == "cpu"
    args.utterances = args.utterances or (48 if cpu else 2000)
    args.vocab_size = args.vocab_size or (200 if cpu else 5000)
    args.shard_mb = args.shard_mb or (0.2 if cpu else 1.0)
    args.untimed_steps = min(args.untimed_steps, args.steps // 2)
    args.overrides = (CPU_SMOKE_OVERRIDES if cpu else []) + overrides
    return args


# ---- Synthetic corpus ----

def pseudo_words(count, rng):
    """``count`` distinct pronounceable pseudo-words of 1-3 consonant-vowel syllables, shuffled
    (their order is their frequency rank in ``transcript``)."""
    syllables = np.array([consonant + vowel for consonant in CONSONANTS for vowel in VOWELS])
    words = {}  # insertion-ordered: deterministic given rng
    while len(words) < count:
        picks, lengths = rng.integers(0, len(syllables), (count, 3)), rng.integers(1, 4, count)
        words.update(dict.fromkeys("".join(syllables[row[:n]]) for row, n in zip(picks, lengths)))
    return rng.permutation(list(words)[:count]).tolist()


def transcript(seconds, words, rng):
    """Zipf-distributed ``words`` (rank = position) at 1.5-3 words per second of audio."""
    count = max(1, round(seconds * rng.uniform(1.5, 3.0)))
    return " ".join(words[i] for i in np.searchsorted(zipf_cdf(len(words)), rng.random(count)))


@functools.cache
def zipf_cdf(size):
    """Cumulative Zipf probabilities (exponent 1) of ``size`` ranks."""
    weights = 1 / np.arange(1, size + 1)
    return np.cumsum(weights) / weights.sum()


def syllable(num_samples, rng):
    """One syllable: harmonics of a pitch gliding between two values in 90-250 Hz, weighted by two
    formant peaks (F1 300-900 Hz, F2 900-2500 Hz), or (one in five) a noise burst; Hann envelope."""
    if rng.random() < 0.2:
        return 0.3 * rng.standard_normal(num_samples) * np.hanning(num_samples)
    pitch = np.linspace(rng.uniform(90, 250), rng.uniform(90, 250), num_samples)
    phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
    f1, f2 = rng.uniform(300, 900), rng.uniform(900, 2500)
    harmonics = np.arange(1, int(4000 / pitch.max()) + 1)
    frequencies = harmonics * pitch.mean()
    gains = np.exp(-((frequencies - f1) / 150) ** 2) + 0.5 * np.exp(-((frequencies - f2) / 250) ** 2)
    voiced = (gains[:, None] * np.sin(harmonics[:, None] * phase)).sum(axis=0)
    return voiced * np.hanning(num_samples)


def synthetic_speech(seconds, rng):
    """``seconds`` of speech-like 16 kHz float32 audio: syllables of 0.12-0.35 s with short pauses,
    over background noise about 30 dB down, peak 0.5."""
    audio = np.zeros(int(seconds * SAMPLE_RATE))
    position = int(rng.uniform(0.05, 0.3) * SAMPLE_RATE)
    while position < len(audio):
        end = min(len(audio), position + int(rng.uniform(0.12, 0.35) * SAMPLE_RATE))
        audio[position:end] += syllable(end - position, rng)
        position = end + int(rng.exponential(0.06) * SAMPLE_RATE)
    audio /= max(np.abs(audio).max(), 1e-6)
    audio += 0.03 * rng.standard_normal(len(audio))
    return (0.5 * audio / np.abs(audio).max()).astype(np.float32)


def write_utterance(job):
    """Pool job ``(path, seconds, seed)``: write one synthetic utterance as 16-bit wav."""
    path, seconds, seed = job
    audio = synthetic_speech(seconds, np.random.default_rng(seed))
    sf.write(path, audio, SAMPLE_RATE, subtype="PCM_16")


def synthesize_corpus(folder, count, seed, jobs):
    """Write ``count`` utterances (2-20 s, lognormal around 6 s) and ``train.jsonl``; returns its path.

    A finished corpus (the manifest is written last) is reused.
    """
    manifest = os.path.join(folder, "train.jsonl")
    if os.path.isfile(manifest):
        logger.info("corpus: reusing %s", manifest)
        return manifest
    os.makedirs(os.path.join(folder, "wav"), exist_ok=True)
    rng = np.random.default_rng(seed)
    words = pseudo_words(50000, rng)  # enough distinct words for 5000 unigram pieces
    seconds = np.clip(rng.lognormal(np.log(6.0), 0.6, count), 2.0, 20.0).round(2)
    records = [{"id": f"synth{i:06d}", "audio": f"wav/synth{i:06d}.wav",
                "text": transcript(s, words, rng), "speaker": f"spk{i % 50:02d}"}
               for i, s in enumerate(seconds)]
    with process_pool(jobs) as pool:
        pool.map(write_utterance, [(os.path.join(folder, r["audio"]), s, [seed, i])
                                   for i, (r, s) in enumerate(zip(records, seconds))], chunksize=8)
    atomic_write_text(manifest, "".join(json.dumps(r) + "\n" for r in records))
    logger.info("corpus: %d utterances, %.2f h -> %s", count, seconds.sum() / 3600, manifest)
    return manifest


def run_tool(script, *args):
    """Run a ``local/`` command-line tool with this interpreter; its failure stops the check."""
    command = [sys.executable, os.path.join(REPO, "local", script), *map(str, args)]
    if subprocess.run(command).returncode != 0:
        raise CheckError(f"{script} failed (command: {' '.join(command)}): see its error above")


def prepare_data(args):
    """Corpus -> shards -> tokenizer under ``args.out``; returns (parquet path, tokenizer path)."""
    data = os.path.join(args.out, f"data_{args.utterances}utt_{args.shard_mb:g}mb_seed{args.seed}")
    manifest = synthesize_corpus(os.path.join(data, "corpus"), args.utterances, args.seed, args.jobs)
    shards = os.path.join(data, "shards")
    run_tool("make_shards.py", manifest, shards, "--jobs", args.jobs, "--shard-size", args.shard_mb,
             "--prefix", "train")
    tokenizer = os.path.join(data, "tokenizer", f"unigram_{args.vocab_size}.model")
    if not os.path.isfile(tokenizer):
        run_tool("train_tokenizer.py", shards, os.path.dirname(tokenizer),
                 "--vocab-size", args.vocab_size)
    return os.path.join(shards, "metadata_pool.parquet"), tokenizer


# ---- Measured training ----

class TimedASR(train.ASR):
    """The finetune recipe's Brain, recording for every batch the wait for it (s, from the train
    loader's ``wait_seconds``), its utterances, its unpadded audio (s) and whether it opened an epoch
    (its wait includes starting the loader's workers); stamping the end of every update (after the
    device finished it) and stopping once ``max_train_seconds`` have passed. ``on_untimed_done`` is
    called when the first ``untimed_steps`` updates are done."""

    untimed_steps, max_train_seconds, on_untimed_done = 0, float("inf"), None

    def on_fit_start(self):
        super().on_fit_start()
        self.step_ends, self.records, self.fit_began = [], [], time.perf_counter()

    def on_fit_batch_start(self, batch, should_step):
        super().on_fit_batch_start(batch, should_step)
        loader = self.train_loader
        epoch_start = loader.position == 1  # ``wait_seconds`` restarts with each epoch's ``for`` loop
        waited_before = 0.0 if epoch_start else self.waited
        self.waited = loader.wait_seconds
        self.records.append({"wait_s": self.waited - waited_before, "utterances": len(batch.id),
                             "audio_s": float(batch.duration.sum()),
                             "epoch_start": epoch_start})

    def on_fit_batch_end(self, batch, outputs, loss, should_step):
        super().on_fit_batch_end(batch, outputs, loss, should_step)
        if self.device_type == "cuda":
            torch.cuda.synchronize(self.device)
        self.step_ends.append(time.perf_counter())
        if len(self.step_ends) == self.untimed_steps and self.on_untimed_done:
            self.on_untimed_done()
        if self.step_ends[-1] - self.fit_began > self.max_train_seconds:
            logger.warning("stopping after %d updates: --max-train-seconds=%g reached",
                           self.optimizer_step, self.max_train_seconds)
            self.optimizer_step_limit = self.optimizer_step


class GpuPoller:
    """``nvidia-smi`` in the background, one (utilisation %, memory used MiB) sample every 500 ms."""

    def __init__(self, device):
        self.samples, self.process = [], None
        self.index = nvidia_smi_index(device)

    def start(self):
        """Start polling; without nvidia-smi, log it and keep no samples."""
        if shutil.which("nvidia-smi") is None:
            logger.warning("nvidia-smi not found: GPU utilisation is not measured")
            return
        self.process = subprocess.Popen(
            ["nvidia-smi", "-i", self.index, "--query-gpu=utilization.gpu,memory.used",
             "--format=csv,noheader,nounits", "-lms", "500"], stdout=subprocess.PIPE, text=True)
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self):
        for line in self.process.stdout:
            fields = [field.strip() for field in line.split(",")]
            if len(fields) == 2 and all(field.isdigit() for field in fields):
                self.samples.append((int(fields[0]), int(fields[1])))

    def stop(self):
        """Stop polling; returns the samples."""
        if self.process is not None:
            self.process.terminate()
            self.process.wait()
            self.reader.join(timeout=2)
        return self.samples


def nvidia_smi_index(device):
    """nvidia-smi's id (index or UUID) of a torch device, through CUDA_VISIBLE_DEVICES if set."""
    index = torch.device(device).index or 0
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[index].strip() if index < len(visible) else str(index)


def check_device(device):
    """Raise when a CUDA device is asked for but torch cannot use one."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CheckError(f"--device {device} but torch {torch.__version__} sees no CUDA GPU "
                           f"(built for CUDA {torch.version.cuda}): run on a GPU machine, or pass "
                           "--device cpu for a smoke run")


def train_argv(args, parquet, tokenizer):
    """train.py's argv: the real config, the generated data, no validation or test, no checkpoints
    during the run, then the overrides (the last word wins)."""
    return [CONFIG, f"--output_folder={os.path.join(args.out, 'exp')}",
            f"--tokenizer_file={tokenizer}", f"--train_parquet={parquet}",
            f"--valid_parquet={parquet}", "--test_parquets=[]", "--do_test=False",
            f"--device={args.device}", "--ckpt_interval_minutes=0", "--noprogressbar", *args.overrides]


def run_training(args, parquet, tokenizer):
    """Train with timing; returns (brain, hparams, GPU samples after the untimed steps)."""
    shutil.rmtree(os.path.join(args.out, "exp"), ignore_errors=True)  # a fresh run, nothing to resume
    brain, hparams = train.build_brain(train_argv(args, parquet, tokenizer), TimedASR)
    brain.train_loader = train.speech_loader(hparams, hparams["train_parquet"], True)
    poller = GpuPoller(args.device) if brain.device_type == "cuda" else None
    brain.untimed_steps, brain.max_train_seconds = max(args.untimed_steps, 1), args.max_train_seconds
    brain.optimizer_step_limit = args.steps  # SpeechBrain's stop; its command-line form stays a str
    brain.on_untimed_done = poller.start if poller else None
    try:
        brain.fit(hparams["epoch_counter"], brain.train_loader)
    finally:
        samples = poller.stop() if poller else []
    return brain, hparams, samples


def step_figures(step_ends, records, untimed):
    """Step times (ms), rates and data waits (% of wall time) over the updates after the first
    ``untimed`` (at least one); ``records`` are ``TimedASR``'s, one per batch, in order."""
    timed = records[untimed:len(step_ends)]
    if not timed:
        raise CheckError(f"only {len(step_ends)} updates ran, none after the {untimed} untimed ones: "
                           "raise --steps or --max-train-seconds")
    wall = step_ends[-1] - step_ends[untimed - 1]
    steps_ms = [1000 * (b - a) for a, b in zip(step_ends[untimed - 1:], step_ends[untimed:])]
    wait = sum(r["wait_s"] for r in timed)
    start_wait = sum(r["wait_s"] for r in timed if r["epoch_start"])
    audio = sum(r["audio_s"] for r in timed)
    return {"timed_steps": len(timed), "untimed_steps": untimed,
            "epoch_starts": sum(r["epoch_start"] for r in timed),
            "step_ms_median": statistics.median(steps_ms), "step_ms_mean": statistics.fmean(steps_ms),
            "utt_per_s": sum(r["utterances"] for r in timed) / wall, "audio_s_per_s": audio / wall,
            "compute_bound_audio_s_per_s": audio / (wall - wait), "data_wait_pct": 100 * wait / wall,
            "data_wait_pct_without_epoch_starts": 100 * (wait - start_wait) / (wall - start_wait)}


def device_figures(brain, gpu_samples):
    """The device's name, mean utilisation (%) and memory (GiB) from nvidia-smi samples, and the peak
    memory torch allocated (GiB); None where not measured (CPU, no nvidia-smi)."""
    cuda = brain.device_type == "cuda"
    return {
        "device": torch.cuda.get_device_name(brain.device) if cuda else "cpu",
        "precision": brain.precision,
        "gpu_util_pct": statistics.fmean(u for u, _ in gpu_samples) if gpu_samples else None,
        "gpu_mem_used_gib_max": max(m for _, m in gpu_samples) / 1024 if gpu_samples else None,
        "peak_gpu_mem_gib": torch.cuda.max_memory_allocated(brain.device) / 2**30 if cuda else None}


def show(value, digits=1):
    """A figure for the table: n/a when not measured."""
    return "n/a" if value is None else f"{value:.{digits}f}"


def print_table(result):
    """The figures as a markdown table, with the context line above it."""
    print(f"\nGPU check: {CONFIG} on {result['device']}, {result['precision']}, {result['timed_steps']} "
          f"timed updates after {result['untimed_steps']} untimed, {result['max_batch_seconds']:g} s "
          f"batches, {result['num_workers']} loader workers, {result['epoch_starts']} epoch starts; "
          f"data preparation {result['prep_s']:.0f} s, training {result['train_s']:.0f} s")
    rows = [("step time, median (ms)", show(result["step_ms_median"])),
            ("step time, mean (ms)", show(result["step_ms_mean"])),
            ("utterances/s", show(result["utt_per_s"])),
            ("audio s/s", show(result["audio_s_per_s"])),
            ("audio s/s without data waits (compute-bound)", show(result["compute_bound_audio_s_per_s"])),
            ("achieved / compute-bound",
             show(result["audio_s_per_s"] / result["compute_bound_audio_s_per_s"], 3)),
            ("GPU utilisation, mean (%)", show(result["gpu_util_pct"])),
            ("peak GPU memory allocated by torch (GiB)", show(result["peak_gpu_mem_gib"], 2)),
            ("data wait (% of wall time)", show(result["data_wait_pct"])),
            ("data wait without epoch starts (%)", show(result["data_wait_pct_without_epoch_starts"]))]
    print("| figure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out = os.path.abspath(args.out)
    os.chdir(REPO)  # the config's relative paths (!include:)
    check_device(args.device)
    began = time.perf_counter()
    parquet, tokenizer = prepare_data(args)
    prepared = time.perf_counter()
    brain, hparams, samples = run_training(args, parquet, tokenizer)
    result = {**device_figures(brain, samples),
              **step_figures(brain.step_ends, brain.records, max(args.untimed_steps, 1)),
              "max_batch_seconds": hparams["max_batch_seconds"], "num_workers": hparams["num_workers"],
              "prep_s": prepared - began, "train_s": time.perf_counter() - prepared}
    print_table(result)
    if args.json:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        main()
    except CheckError as error:
        sys.exit(f"error: {error}")
