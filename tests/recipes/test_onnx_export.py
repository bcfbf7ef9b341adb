"""Exported models decode as transcribe.py does: the SpeechBrain export read through custom.py, and the ONNX
export run by onnx_transcribe.py (numpy, soundfile and onnxruntime only), at 8-44.1 kHz, mono and stereo."""

import importlib.util
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import scipy.signal
import soundfile as sf
import torch

from common import streaming
from common.audio_io import to_mono_rate
from common.inference import load_trained, split_at_silences
from common.onnx_export import TokenDecoder, feature_settings, stft_power
from recipes.finetune import export, onnx_transcribe, transcribe
from tests.recipes.test_transcribe import manifest_with_absolute_paths, printed

RATES = (8000, 16000, 22050, 44100)
ONNX_TRANSCRIBE = os.path.abspath(onnx_transcribe.__file__)
# What onnx_transcribe.py must run without (the training stack and the project itself).
FORBIDDEN = ("torch", "torchaudio", "speechbrain", "scipy", "sentencepiece", "hyperpyyaml", "common", "local",
             "recipes", "tests")


@pytest.fixture(scope="module")
def talkative(trained, tmp_path_factory):
    """The tiny trained experiment with its CTC blank made 4 nats less likely: the tiny model's greedy
    CTC says nothing otherwise, and equal empty hypotheses would prove nothing."""
    exp = tmp_path_factory.mktemp("talkative") / "exp"
    shutil.copytree(trained, exp)
    state = torch.load(exp / "averaged.ckpt", map_location="cpu")
    state["model"]["ctc_lin.w.bias"][0] -= 4.0
    torch.save(state, exp / "averaged.ckpt")
    return exp


@pytest.fixture(scope="module")
def rate_files(speech_corpus, tmp_path_factory):
    """Two test utterances at each of RATES, the second one stereo (its channels differ in level)."""
    folder = tmp_path_factory.mktemp("rates")
    _, records = manifest_with_absolute_paths(speech_corpus, folder, count=2)
    paths = []
    for index, record in enumerate(records):
        samples, _ = sf.read(record["audio"], dtype="float32")
        for rate in RATES:
            resampled = scipy.signal.resample_poly(samples, rate, 16000) if rate != 16000 else samples
            if index == 1:
                resampled = np.stack([resampled, 0.5 * resampled], axis=1)
            paths.append(folder / f"u{index}_{rate}.wav")
            sf.write(paths[-1], resampled.astype("float32"), rate)
    return paths


@pytest.fixture(scope="module")
def exported(talkative, tmp_path_factory):
    out = tmp_path_factory.mktemp("exported") / "model"
    assert export.main([str(talkative), str(out), "--onnx"]) == 0
    return out


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000, 11025])
def test_the_numpy_resampler_is_scipys_resample_poly(rate):
    """onnx_transcribe.py's polyphase resampler gives the samples of transcribe.py's reader (SciPy's
    resample_poly) bit for bit: the Opus pass after it would turn a one-ulp difference into a different
    hypothesis."""
    samples = np.random.default_rng(0).standard_normal((int(0.7 * rate), 2)).astype(np.float32) * 0.3
    ours = onnx_transcribe.to_mono_rate(samples, rate, 16000)
    theirs = to_mono_rate(samples, rate, 16000)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == np.float32
    assert np.array_equal(ours, theirs)


def test_the_numpy_power_spectrum_is_the_fbanks(trained):
    """The |STFT|² onnx_transcribe.py computes with numpy equals the one the model's Fbank computes."""
    model = load_trained(trained).model
    samples = np.random.default_rng(1).standard_normal(16123).astype(np.float32) * 0.1
    theirs = stft_power(model, torch.from_numpy(samples)[None])[0].numpy()
    ours = onnx_transcribe.power_spectrum(samples, feature_settings(model, 16000))
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6 * theirs.max())


def test_the_standalone_cuts_are_common_inferences():
    """onnx_transcribe.py's copy of split_at_silences cuts where common.inference's does."""
    samples = np.random.default_rng(2).standard_normal(16000 * 25).astype(np.float32)
    samples[16000 * 7:16000 * 8] *= 0.01
    assert onnx_transcribe.split_at_silences(samples, 10.0, 16000) == split_at_silences(samples, 10.0)


def test_piece_to_text_is_sentencepieces(trained, exported):
    """Random id sequences (control and unknown ids among them, half of them after one to three word-boundary
    pieces, which SentencePiece drops at the start) decode to SentencePiece's text."""
    import json

    tokens = json.loads((exported / onnx_transcribe.CONFIG_FILE).read_text(encoding="utf-8"))["tokens"]
    processor = load_trained(trained).tokenizer.processor
    rng = np.random.default_rng(3)
    space = tokens["pieces"].index("▁")
    for _ in range(400):
        ids = [int(i) for i in rng.integers(0, len(tokens["pieces"]), size=int(rng.integers(0, 12)))]
        ids = [space] * int(rng.integers(1, 4)) * int(rng.random() < 0.5) + ids
        assert onnx_transcribe.detokenize(ids, tokens) == processor.decode(ids), ids


def test_onnx_log_probs_and_hypotheses_equal_torchs(talkative, exported, rate_files, capsys):
    """On the same audio the ONNX encoder's CTC log-probabilities are the torch model's (within 1e-4), and
    onnx_transcribe.py prints transcribe.py --ctc_greedy's lines at every rate, mono and stereo, not all
    of them empty."""
    trained = load_trained(talkative)
    runtime = onnx_transcribe.OnnxTranscriber(str(exported))
    for path in rate_files:
        samples = onnx_transcribe.read_recording(str(path), 16000)
        with torch.no_grad():
            wav = torch.from_numpy(samples)[None]
            theirs = trained.model.ctc_log_probs(trained.model.encode(wav, torch.ones(1)))[0].numpy()
        ours = runtime.ctc_log_probs(samples)
        assert ours.shape == theirs.shape and np.abs(ours - theirs).max() < 1e-4, path
    files = [str(p) for p in rate_files]
    assert transcribe.main([str(talkative), *files, "--ctc_greedy", "--max_batch_size", "1"]) == 0
    torch_lines, _ = printed(capsys)
    assert onnx_transcribe.main([str(exported), *files]) == 0
    onnx_lines, order = printed(capsys)
    assert onnx_lines == torch_lines and order == [p.stem for p in rate_files]
    assert sum(bool(text.strip()) for text in onnx_lines.values()) >= len(files) // 2


@pytest.mark.parametrize("seed", range(12))
def test_the_numpy_prefix_beam_is_speechbrains(seed):
    """onnx_transcribe's PrefixBeam, carried over two chunks as its streaming recognizer carries it, and
    ctc_prefix_beam over the whole recording give SpeechBrain's CTCPrefixBeamSearcher's n-best (as
    common/streaming.py runs it, over two chunks), in the same order with the same CTC scores, on random
    log-probabilities from peaked to flat."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(30, 9)) * (1 + seed % 4)
    logits[:, 0] += 1.5  # the blank, as in a trained model
    log_probs = torch.log_softmax(torch.tensor(logits), dim=-1).numpy()
    searcher = streaming.prefix_searcher(9, 6)
    beams = searcher.partial_decoding(log_probs[:12], 12, [streaming.start_beam()], {}, {}, 0)
    beams = searcher.partial_decoding(log_probs[12:], 18, beams, {}, {}, 12)
    expected = streaming.finished_nbest(searcher, beams)
    carried = onnx_transcribe.PrefixBeam(0, 6)
    carried.extend(log_probs[:12])
    carried.extend(log_probs[12:])
    for ours in (onnx_transcribe.ctc_prefix_beam(log_probs, 0, 6), carried.nbest()):
        assert [ids for ids, _ in ours] == expected[0] and len(ours) > 1
        assert np.allclose([score for _, score in ours], expected[1])


@torch.no_grad()
def test_onnx_beam_equals_torchs_rescored_prefix_beam(talkative, exported, rate_files, capsys):
    """The ONNX decoder's log-probabilities are the torch decoder's (within 1e-4), and onnx_transcribe.py
    --beam prints what the torch model gives with the same search (SpeechBrain's CTC prefix beam, its n-best
    rescored by common.streaming.rescore with the config's weights), not all empty."""
    trained, runtime = load_trained(talkative), onnx_transcribe.OnnxTranscriber(str(exported))
    settings, expected = trained.settings, {}
    for path in rate_files:
        samples = onnx_transcribe.read_recording(str(path), 16000)
        enc_states = trained.model.encode(torch.from_numpy(samples)[None], torch.ones(1))
        tokens = torch.tensor([[1, 5, 6, 7], [1, 8, 2, 2]])
        theirs = TokenDecoder(trained.model)(tokens, enc_states.expand(2, -1, -1)).numpy()
        ours = runtime.decoder.run(["log_probs"], {"tokens": tokens.numpy(),
                                                   "enc_states": np.repeat(runtime.encode(samples)[1], 2, 0)})[0]
        assert np.abs(ours - theirs).max() < 1e-4, path
        log_probs = streaming.ctc_search_log_probs(trained.model, enc_states)
        searcher = streaming.prefix_searcher(log_probs.shape[1], 4)
        nbest, ctc = streaming.finished_nbest(searcher, searcher.partial_decoding(
            log_probs.numpy(), len(log_probs), [streaming.start_beam()], {}, {}, 0))
        best = []
        if nbest:
            scores = streaming.rescore(trained.model, enc_states, nbest, torch.tensor(ctc), settings["ctc_weight"],
                                       settings["length_normalization"], prefix_ids=trained.prefix_ids)
            best = nbest[int(scores.argmax())]
        expected[path.stem] = trained.tokenizer.processor.decode(best)
    assert onnx_transcribe.main([str(exported), *map(str, rate_files), "--beam", "4"]) == 0
    lines, _ = printed(capsys)
    assert lines == expected and sum(bool(text.strip()) for text in lines.values()) >= len(rate_files) // 2


def test_the_speechbrain_export_reads_audio_as_transcribe_py(talkative, exported, rate_files, tmp_path, capsys):
    """custom.py's TandemASR (the exported folder through SpeechBrain's foreign_class) gives transcribe.py's
    beam-search hypotheses (Opus pass on, as in training) at every rate, mono and stereo."""
    from speechbrain.inference.interfaces import foreign_class

    files = [str(p) for p in rate_files]
    assert transcribe.main([str(talkative), *files, "--max_batch_size", "1"]) == 0
    ours, order = printed(capsys)
    asr = foreign_class(source=str(exported), pymodule_file="custom.py", classname="TandemASR",
                        savedir=str(tmp_path / "loaded"))
    theirs = {key: asr.transcribe_file(path) for key, path in zip(order, files)}
    assert theirs == ours and any(text.strip() for text in ours.values())


def isolated_python(blocked):
    """A ``python -I -S`` command line whose imports see the interpreter's standard library and the
    folders that hold numpy, soundfile and onnxruntime, but not the project (no script folder, no
    PYTHONPATH, no .pth files: the editable install is one) and none of ``blocked`` (a meta-path finder
    refuses them, since they may share a site-packages folder with the three)."""
    folders = sorted({os.path.dirname(os.path.dirname(spec.origin)) if spec.submodule_search_locations
                      else os.path.dirname(spec.origin)
                      for spec in map(importlib.util.find_spec, ("numpy", "soundfile", "onnxruntime"))})
    prelude = ("import sys, runpy, importlib.abc\n"
               f"sys.path += {folders!r}\n"
               "class Refuse(importlib.abc.MetaPathFinder):\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               f"        if name.split('.')[0] in {blocked!r}:\n"
               "            raise ImportError(f'{name} is not available here')\n"
               "sys.meta_path.insert(0, Refuse())\n"
               "script = sys.argv.pop(1)\n"
               "sys.argv[0] = script\n"
               "runpy.run_path(script, run_name='__main__')\n")
    return [sys.executable, "-I", "-S", "-c", prelude]


def test_the_onnx_folder_runs_without_the_training_stack_or_the_project(exported, rate_files, tmp_path, capsys):
    """onnx_transcribe.py --beam (encoder and decoder), copied out of the repository and run in a subprocess
    that cannot import torch, SpeechBrain, SciPy, SentencePiece or the project, prints the same lines as
    in-process."""
    script = shutil.copy(ONNX_TRANSCRIBE, tmp_path / "onnx_transcribe.py")
    files = [str(p) for p in rate_files[:4]]
    result = subprocess.run([*isolated_python(FORBIDDEN), str(script), str(exported), *files, "--beam", "4"],
                            capture_output=True, text=True, cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    assert result.returncode == 0, result.stderr[-3000:]
    onnx_transcribe.main([str(exported), *files, "--beam", "4"])
    expected, _ = printed(capsys)
    assert dict(line.split("\t") for line in result.stdout.splitlines()) == expected
    (tmp_path / "uses_torch.py").write_text("import torch\n")
    refused = subprocess.run([*isolated_python(FORBIDDEN), str(tmp_path / "uses_torch.py")], capture_output=True,
                             text=True, env={"PATH": os.environ["PATH"]})
    assert refused.returncode != 0 and "not available" in refused.stderr  # the isolation is real
