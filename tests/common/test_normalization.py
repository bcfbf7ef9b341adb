"""common/models/normalization.py: SpeechBrain's normalizers unchanged, and a frame-level one that removes
the recording level and streams."""

import pytest
import torch
from speechbrain.lobes.features import Fbank
from speechbrain.processing.features import InputNormalization

from common.models.normalization import Normalization
from common.streaming import StreamingRecognizer
from recipes.finetune.export import speechbrain_graph
from tests.common.test_models import fit_normalization, load_graph


@pytest.mark.parametrize("norm_type", ["global", "sentence"])
def test_global_and_sentence_are_speechbrains(norm_type):
    """Normalization of the types SpeechBrain has gives InputNormalization's output, in training (global
    statistics updated alike) and in evaluation."""
    torch.manual_seed(0)
    feats, lengths = torch.randn(3, 50, 20) * 4 + 2, torch.tensor([1.0, 0.8, 0.5])
    ours, theirs = Normalization(norm_type), InputNormalization(norm_type=norm_type)
    for module in (ours, theirs):
        module.train()
    assert torch.allclose(ours(feats, lengths), theirs(feats, lengths))
    ours.eval(), theirs.eval()
    assert torch.allclose(ours(feats * 0.5, lengths), theirs(feats * 0.5, lengths))


def test_frame_normalization_removes_the_recording_level():
    """With norm_type frame, the same noise at a level 12 dB lower gives the same normalized features
    (within float error; the Fbank's 80 dB floor is never reached on noise), where global normalization
    keeps the difference; an unknown type is refused."""
    fbank, noise = Fbank(n_mels=20), torch.randn(1, 16000, generator=torch.Generator().manual_seed(0))
    loud, quiet = fbank(noise), fbank(noise * 0.25)
    frame, plain = Normalization("frame"), Normalization("global")
    for module in (frame, plain):
        module.train()
        module(torch.cat([loud, quiet]), torch.ones(2))
        module.eval()
    assert (frame(loud) - frame(quiet)).abs().max() < 1e-3
    assert (plain(loud) - plain(quiet)).abs().max() > 0.5
    with pytest.raises(ValueError, match="normalize_type: 'utterance'"):
        Normalization("utterance")


@torch.no_grad()
def test_a_frame_normalized_model_streams_as_it_decodes_offline():
    """A model normalizing with norm_type frame passes check_streamable, and a chunk covering the recording
    gives offline greedy CTC's ids (the level is removed per frame: no statistic of the whole recording)."""
    graph = load_graph(attention_type="RelPosMHAXL", num_encoder_layers=2, conformer_kernel_size=5,
                       normalize_type="frame")
    noise = torch.randn(30000, generator=torch.Generator().manual_seed(1)) * 0.1
    model = fit_normalization(graph["model"], torch.randn(2, 16000) * 0.1, torch.ones(2))
    model.ctc_lin.w.bias.data[0] -= 4.0  # the blank less likely: an empty hypothesis would prove nothing
    recognizer = StreamingRecognizer(model, chunk_frames=1000, left_chunks=1)
    recognizer.push(noise, final=True)
    best = model.ctc_log_probs(model.encode(noise[None], torch.ones(1)))[0].argmax(-1).tolist()
    offline = [t for i, t in enumerate(best) if t != 0 and (i == 0 or t != best[i - 1])]
    assert recognizer.ids == offline and len(offline) > 3


def test_the_speechbrain_export_names_speechbrains_normalizer_and_refuses_frame():
    """The exported graph names SpeechBrain's InputNormalization (it loads without Tandem); a frame-level
    normalizer has no SpeechBrain counterpart: None (export.py then writes the ONNX files only)."""
    text = "normalize: !new:common.models.normalization.Normalization\n    norm_type: {}\n"
    assert "!new:speechbrain.processing.features.InputNormalization" in speechbrain_graph(text.format("global"))
    assert speechbrain_graph(text.format("frame")) is None


def test_causal_statistics_look_back_only_and_carry_across_pieces():
    """norm_type causal: frame t is normalized by each bin's mean / std over the corpus prior (100 frames)
    and frames 0..t, computed here by hand; normalizing the second half with the first half's sums as
    history equals normalizing the whole, and so does a window whose leading frames ``first`` leaves out;
    padding after a row changes none of its frames."""
    torch.manual_seed(0)
    x = torch.randn(1, 60, 4) * 3 + 5
    causal = Normalization("causal")
    causal.train()
    causal(torch.randn(2, 50, 4), torch.ones(2))  # the corpus statistics
    causal.eval()
    out = causal(x)
    mean, var, t = causal.glob_mean.double(), causal.glob_std.double().square(), 37
    seen = x[0, :t + 1].double()
    running_mean = (100 * mean + seen.sum(0)) / (100 + t + 1)
    running_var = (100 * (var + mean.square()) + seen.square().sum(0)) / (100 + t + 1) - running_mean.square()
    assert torch.allclose(out[0, t].double(), (x[0, t].double() - running_mean) / running_var.sqrt(), atol=1e-5)
    head = x[:, :25].double()[0]
    history = (25, head.sum(0), head.square().sum(0))
    assert torch.allclose(torch.cat([causal.causal(x[:, :25]), causal.causal(x[:, 25:], history)], dim=1), out,
                          atol=1e-5)
    padded = torch.cat([x, torch.zeros(1, 20, 4)], dim=1)
    assert torch.allclose(causal(padded, torch.tensor([60 / 80]))[:, :60], out)
    # first=k (a streamed window whose first frames are not exact): those come out zero and uncounted
    windowed = causal.causal(torch.cat([torch.full((1, 7, 4), 99.0), x[:, 25:]], dim=1), history,
                             first=torch.tensor(7))
    assert torch.equal(windowed[:, :7], torch.zeros(1, 7, 4))
    assert torch.allclose(windowed[:, 7:], out[:, 25:], atol=1e-5)
