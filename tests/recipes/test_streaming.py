"""Dynamic chunk training (chunk_training: True) and transcribe.py --stream on a tiny trained model."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
from speechbrain.utils.dynamic_chunk_training import DynChunkTrainConfig

from common import streaming
from common.user_errors import UserError
from recipes.finetune import export, onnx_transcribe, train, transcribe
from tests.recipes.finetune_args import CHUNK_WARMUP, REPO, train_argv
from tests.recipes.test_onnx_export import FORBIDDEN, isolated_python
from tests.recipes.test_transcribe import manifest_with_absolute_paths, printed


@pytest.fixture(scope="module")
def test_files(speech_corpus, tmp_path_factory):
    _, records = manifest_with_absolute_paths(speech_corpus, tmp_path_factory.mktemp("stream"), count=3)
    return [r["audio"] for r in records]


def test_every_training_batch_draws_a_chunk_configuration_and_evaluation_none(chunk_trained):
    """With chunk_training on (chunk_prob 1), the first chunk_warmup_steps updates encode with full context,
    then each training pass under a DynChunkTrainConfig drawn from the configured ranges (chunks of 2-4
    frames, left context 1-2 chunks or unlimited, both seen), and validation and test encode with full
    context; the run trains to its test stage."""
    exp, calls = chunk_trained
    trained = [config for training, config in calls if training]
    warmup, drawn = trained[:CHUNK_WARMUP], trained[CHUNK_WARMUP:]
    assert warmup == [None] * CHUNK_WARMUP
    assert drawn and all(isinstance(c, DynChunkTrainConfig) and 2 <= c.chunk_size <= 4 for c in drawn)
    lefts = {c.left_context_size for c in drawn}
    assert None in lefts and lefts - {None} <= {1, 2} and lefts - {None}
    evaluated = [config for training, config in calls if not training]
    assert evaluated and all(config is None for config in evaluated)
    assert (exp / "results.json").is_file()


def test_a_model_that_cannot_stream_is_refused_before_training(speech_shards, tokenizer_file, tmp_path):
    """chunk_training with absolute positions (the demo's regularMHA) stops with the key to change."""
    with pytest.raises(ValueError, match="attention_type: RelPosMHAXL"):
        train.main(train_argv(speech_shards, tokenizer_file, tmp_path / "exp", "--chunk_training=True"))


def test_streaming_a_file_in_one_chunk_equals_offline_greedy(chunk_trained, test_files, capsys):
    """--stream with a chunk longer than each recording prints offline greedy CTC's lines (not all empty);
    at 160 ms chunks it prints a line per recording and its partial hypotheses on stderr."""
    exp, _ = chunk_trained
    assert transcribe.main([str(exp), *test_files, "--ctc_greedy", "--max_batch_size", "1"]) == 0
    offline, order = printed(capsys)
    assert transcribe.main([str(exp), *test_files, "--stream", "--ctc_greedy", "--chunk_ms", "60000"]) == 0
    streamed, streamed_order = printed(capsys)
    assert streamed == offline and streamed_order == order and any(offline.values())
    assert transcribe.main([str(exp), *test_files, "--stream", "--ctc_greedy", "--chunk_ms", "160",
                            "--left_chunks", "2"]) == 0
    out = capsys.readouterr()
    assert [line.split("\t")[0] for line in out.out.splitlines() if "\t" in line] == order
    assert "partial\t" in out.err


@pytest.mark.parametrize("chunk_ms,endpoint_ms", [(60000, 1e9), (160, 0)])
def test_streaming_beam_prints_its_rescored_segments_joined(chunk_trained, test_files, capsys, chunk_ms, endpoint_ms):
    """--stream's default search (CTC prefix beam, attention rescoring at endpoints): each recording's
    stdout line is its ``final`` segments joined. A chunk covering the recording with no endpoint before the
    end gives one segment per recording; an endpoint at no silence (each chunk that decodes something ends
    a segment) at 160 ms chunks cuts at least one recording into several."""
    exp, _ = chunk_trained
    assert transcribe.main([str(exp), *test_files, "--stream", "--chunk_ms", str(chunk_ms), "--left_chunks", "2",
                            "--endpoint_ms", str(endpoint_ms), "--beam", "4"]) == 0
    out = capsys.readouterr()
    lines = dict(line.split("\t", 1) for line in out.out.splitlines() if "\t" in line)
    finals = {}
    for line in out.err.splitlines():
        if line.startswith("final\t"):
            _, key, text = line.split("\t")
            finals.setdefault(key, []).append(text)
    assert len(lines) == len(test_files) and any(lines.values())
    assert all(lines[key] == " ".join(t for t in finals.get(key, []) if t) for key in lines)
    counts = [len(finals.get(key, [])) for key in lines]
    assert max(counts) == 1 if chunk_ms == 60000 else max(counts) > 1


def test_stdin_pcm_with_a_partial_final_chunk_ends_when_the_pipe_closes(chunk_trained, test_files, tmp_path):
    """Raw 16-bit PCM written to transcribe.py's stdin in uneven pieces, ending inside a chunk and with an
    odd byte, then the pipe closed: the process decodes what came and prints the line file streaming
    prints for the same samples (the odd byte dropped with a warning)."""
    exp, _ = chunk_trained
    samples, _ = sf.read(test_files[0], dtype="int16")
    sf.write(tmp_path / "same.wav", samples, 16000, subtype="PCM_16")
    command = [sys.executable, os.path.join(REPO, "recipes", "finetune", "transcribe.py"), str(exp), "-",
               str(tmp_path / "same.wav"), "--stream", "--chunk_ms", "320", "--raw_audio"]
    env = dict(os.environ, PYTHONPATH=REPO)
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env)
    data = samples.astype("<i2").tobytes() + b"\x01"
    assert (len(data) - 1) // 2 % 5120 != 0  # the last 320 ms chunk is partial
    for start in range(0, len(data), 3001):
        process.stdin.write(data[start:start + 3001])
    out, err = process.communicate()  # closes stdin
    assert process.returncode == 0, err.decode()[-3000:]
    lines = dict(line.split("\t") for line in out.decode().splitlines())
    assert lines["stdin"] == lines["same"] and "last byte was dropped" in err.decode()


def test_a_closed_stdout_stops_streaming_quietly(chunk_trained, test_files):
    """The reader of stdout gone before the first line (as ``| head -0`` leaves it): --stream stops with a
    warning, exit status 0 and no traceback, instead of dying on BrokenPipeError."""
    command = [sys.executable, os.path.join(REPO, "recipes", "finetune", "transcribe.py"), str(chunk_trained[0]),
               *test_files, "--stream", "--chunk_ms", "640"]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=dict(os.environ, PYTHONPATH=REPO))
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait() == 0, err[-3000:]
    assert "standard output was closed: stopped after" in err and "Traceback" not in err


def test_stdin_needs_stream(chunk_trained):
    with pytest.raises(UserError, match="needs --stream"):
        transcribe.main([str(chunk_trained[0]), "-"])


def test_pcm_pieces_are_the_samples_in_order_whatever_the_reads():
    """pcm_pieces turns a byte stream into float samples (x / 32768), in pieces of the asked size, the last
    shorter."""
    import io

    values = np.arange(-5000, 5000, 7, dtype="<i2")
    pieces = list(transcribe.pcm_pieces(io.BytesIO(values.tobytes()), 300))
    assert [len(p) for p in pieces[:-1]] == [300] * (len(pieces) - 1) and 0 < len(pieces[-1]) <= 300
    assert np.array_equal(np.concatenate(pieces), values.astype(np.float32) / 32768.0)


@pytest.fixture(scope="module")
def exported_stream(chunk_trained, tmp_path_factory):
    """The chunk-trained experiment exported with --onnx (a model that streams gets the streaming graphs)."""
    out = tmp_path_factory.mktemp("exported_stream") / "model"
    assert export.main([str(chunk_trained[0]), str(out), "--onnx"]) == 0
    return out


def stream_lines(err, kind):
    """The ``kind`` (partial, final) lines of a --stream run's stderr."""
    return [line for line in err.splitlines() if line.startswith(kind + "\t")]


@pytest.mark.parametrize("chunk_ms,left_chunks", [(320, 1), (640, 16), (200, 0)])
def test_onnx_streaming_prints_what_torch_streaming_prints(chunk_trained, exported_stream, test_files, capsys,
                                                           chunk_ms, left_chunks):
    """onnx_transcribe.py --stream (the exported front end and encoder step driven by numpy, every layer's
    context carried as tensors) prints transcribe.py --stream --ctc_greedy's final lines and the same
    partial hypotheses in the same order, for chunk sizes that do not divide the recordings and for no left
    context at all; the hypotheses are not all empty."""
    assert {"stream_front_end.onnx", "stream_encoder.onnx"} <= set(os.listdir(exported_stream))
    options = ["--stream", "--chunk_ms", str(chunk_ms), "--left_chunks", str(left_chunks)]
    assert transcribe.main([str(chunk_trained[0]), *test_files, *options, "--ctc_greedy"]) == 0
    torch_out = capsys.readouterr()
    assert onnx_transcribe.main([str(exported_stream), *test_files, *options]) == 0
    onnx_out = capsys.readouterr()
    finals = [dict(line.split("\t") for line in out.out.splitlines() if "\t" in line) for out in (torch_out, onnx_out)]
    assert finals[0] == finals[1] and len(finals[0]) == len(test_files)
    assert any(text.strip() for text in finals[0].values())
    partials = stream_lines(onnx_out.err, "partial")
    assert partials == stream_lines(torch_out.err, "partial") and partials


@pytest.mark.parametrize("chunk_ms,left_chunks,endpoint_ms", [(320, 1, 0), (640, 16, 1000), (200, 0, 1e9)])
def test_onnx_streaming_beam_prints_what_torch_streaming_beam_prints(chunk_trained, exported_stream, test_files,
                                                                     capsys, monkeypatch, chunk_ms, left_chunks,
                                                                     endpoint_ms):
    """onnx_transcribe.py --stream --beam (the numpy CTC prefix beam carried across chunks, WeNet's endpoint
    rules, the exported decoder rescoring each segment over the segment's encoder states, those torch's
    recognizer rescores over) prints transcribe.py --stream --beam's final lines, rescored segments and partial
    hypotheses in the same order: with an endpoint at every chunk that
    decodes something (several segments per recording), at a second of silence, and never before the end."""
    options = ["--stream", "--chunk_ms", str(chunk_ms), "--left_chunks", str(left_chunks), "--endpoint_ms",
               str(endpoint_ms), "--beam", "4"]
    rescored = {"torch": [], "onnx": []}  # the encoder states each segment's n-best is rescored over
    torch_rescore, onnx_rescore = streaming.rescore, onnx_transcribe.OnnxTranscriber.rescore
    monkeypatch.setattr(streaming, "rescore", lambda model, states, *rest: (
        rescored["torch"].append(states[0].numpy()), torch_rescore(model, states, *rest))[1])
    monkeypatch.setattr(onnx_transcribe.OnnxTranscriber, "rescore", lambda self, nbest, states: (
        rescored["onnx"].append(states[0]), onnx_rescore(self, nbest, states))[1])
    assert transcribe.main([str(chunk_trained[0]), *test_files, *options]) == 0
    torch_out = capsys.readouterr()
    assert onnx_transcribe.main([str(exported_stream), *test_files, *options]) == 0
    onnx_out = capsys.readouterr()
    assert [s.shape for s in rescored["onnx"]] == [s.shape for s in rescored["torch"]] and rescored["onnx"]
    assert all(np.allclose(a, b, atol=1e-4) for a, b in zip(rescored["onnx"], rescored["torch"]))
    finals = [dict(line.split("\t") for line in out.out.splitlines() if "\t" in line) for out in (torch_out, onnx_out)]
    assert finals[0] == finals[1] and len(finals[0]) == len(test_files)
    assert any(text.strip() for text in finals[0].values())
    for kind in ("final", "partial"):
        lines = stream_lines(onnx_out.err, kind)
        assert lines == stream_lines(torch_out.err, kind) and lines
    if endpoint_ms == 0:
        assert len(stream_lines(onnx_out.err, "final")) > len(test_files)


def test_onnx_stdin_streaming_runs_without_the_training_stack(exported_stream, test_files, tmp_path):
    """onnx_transcribe.py, copied out of the repository into a process that cannot import torch,
    SpeechBrain or the project, reads raw 16-bit PCM on stdin in uneven writes ending inside a chunk and
    with an odd byte, and prints for it the line it prints for the same samples as a file."""
    script = shutil.copy(onnx_transcribe.__file__, tmp_path / "onnx_transcribe.py")
    samples, _ = sf.read(test_files[0], dtype="int16")
    sf.write(tmp_path / "same.wav", samples, 16000, subtype="PCM_16")
    command = [*isolated_python(FORBIDDEN), str(script), str(exported_stream), "-", str(tmp_path / "same.wav"),
               "--stream", "--chunk_ms", "320", "--raw_audio"]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    data = samples.astype("<i2").tobytes() + b"\x01"
    assert (len(data) - 1) // 2 % 5120 != 0  # the last 320 ms chunk is partial
    for start in range(0, len(data), 3001):
        process.stdin.write(data[start:start + 3001])
    out, err = process.communicate()
    assert process.returncode == 0, err.decode()[-3000:]
    lines = dict(line.split("\t") for line in out.decode().splitlines())
    assert lines["stdin"] == lines["same"] and "last byte was dropped" in err.decode()


def test_onnx_streaming_needs_the_streaming_graphs(exported_stream, test_files, tmp_path, caplog):
    """An export without the streaming graphs (a model that cannot stream) refuses --stream, naming what
    to train and export, with exit status 2."""
    folder = tmp_path / "no_stream"
    shutil.copytree(exported_stream, folder)
    config = json.loads((folder / "onnx_config.json").read_text())
    del config["streaming"]
    (folder / "onnx_config.json").write_text(json.dumps(config))
    assert onnx_transcribe.main([str(folder), test_files[0], "--stream"]) == 2
    assert "chunk_training: True" in caplog.text and "export.py EXP OUT --onnx" in caplog.text
