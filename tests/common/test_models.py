"""Tests for common/models and the shared graph recipes/hparams/model/conformer.yaml."""

import pathlib

import pytest
import torch
from hyperpyyaml import load_hyperpyyaml

REPO_ROOT = pathlib.Path(__file__).parents[2]
GRAPH_YAML = REPO_ROOT / "recipes" / "hparams" / "model" / "conformer.yaml"
TINY = {"vocab_size": 11, "d_model": 16, "nhead": 2, "num_encoder_layers": 1,
        "num_decoder_layers": 1, "d_ffn": 32, "n_mels": 20, "frontend_channels": 4,
        "frontend_out_channels": 4}


def load_graph(**overrides):
    """The shared model graph with tiny sizes (plus ``overrides``)."""
    torch.manual_seed(0)
    with open(GRAPH_YAML) as f:
        return load_hyperpyyaml(f, {**TINY, **overrides})


def fit_normalization(model, wavs, wav_lens):
    """One training-mode pass sets the global mean / std that evaluation needs; returns eval model."""
    model.train()
    model.extract_features(wavs, wav_lens)
    return model.eval()


def test_forward_shapes_follow_the_frontend_stride():
    """1 s of audio = 101 Fbank frames → ceil(101 / 4) = 26 encoder frames at stride 2 x 2."""
    wavs, wav_lens = torch.randn(2, 16000), torch.tensor([1.0, 0.5])
    model = fit_normalization(load_graph()["model"], wavs, wav_lens)
    tokens_bos = torch.tensor([[1, 4, 5], [1, 6, 0]])
    out = model(wavs, wav_lens, tokens_bos)
    assert out.ctc_log_probs.shape == (2, 26, 11)
    assert out.seq_log_probs.shape == (2, 3, 11)
    assert torch.allclose(out.ctc_log_probs.exp().sum(-1), torch.ones(2, 26), atol=1e-5)
    assert torch.allclose(model.encode(wavs, wav_lens), out.enc_states, atol=1e-5)


def test_intermediate_ctc_reads_the_named_layer_through_the_final_norm_and_the_ctc_head():
    """inter_ctc_layers=[1] of 2: its log-probs are ctc_lin(norm(layer 1's output)), found by running the
    first layer by hand; no weights are added and no hook is left behind; a layer out of range is refused."""
    wavs, wav_lens = torch.randn(2, 16000), torch.tensor([1.0, 0.5])
    model = fit_normalization(load_graph(num_encoder_layers=2, inter_ctc_layers=[1])["model"], wavs, wav_lens)
    out = model(wavs, wav_lens, torch.tensor([[1, 4, 5], [1, 6, 0]]))
    transformer = model.transformer
    assert transformer.encoder.layers[0]._forward_hooks == {}
    layer_one = []
    transformer.encoder.layers[0].register_forward_hook(lambda m, args, output: layer_one.append(output[0]))
    transformer.encode(model.frontend(model.extract_features(wavs, wav_lens)), wav_lens, pad_idx=0)
    expected = model.ctc_log_probs(transformer.encoder.norm(layer_one[0]))
    assert len(out.inter_ctc_log_probs) == 1 and out.inter_ctc_log_probs[0].shape == out.ctc_log_probs.shape
    assert torch.allclose(out.inter_ctc_log_probs[0], expected, atol=1e-5)
    assert not torch.allclose(out.inter_ctc_log_probs[0], out.ctc_log_probs, atol=1e-3)
    assert load_graph(num_encoder_layers=2)["model"].state_dict().keys() == model.state_dict().keys()
    with pytest.raises(ValueError, match=r"inter_ctc_layers=\[2\]: \[2\] not an encoder layer 1-1"):
        load_graph(num_encoder_layers=2, inter_ctc_layers=[2])


def test_weight_names_are_the_documented_contract():
    """Pretrain and finetune exchange weights by these top-level names; renaming breaks that."""
    names = {".".join(key.split(".")[:2]) for key in load_graph()["model"].state_dict()}
    for expected in ["frontend.convblock_0", "transformer.encoder", "transformer.decoder",
                     "transformer.custom_src_module", "transformer.custom_tgt_module",
                     "ctc_lin.w", "seq_lin.w"]:
        assert expected in names


def test_every_weight_has_one_learning_rate_group_and_cross_attention_is_its_own():
    """lr_scales groups: each parameter of the graph in exactly one of the four groups; the decoder's
    attention to the encoder (and the norm before it) apart from its language model; a DDP prefix ignored."""
    from common.models.encoder_decoder import parameter_group

    groups = {name: parameter_group(name) for name, _ in load_graph()["model"].named_parameters()}
    assert set(groups.values()) == {"encoder", "ctc", "cross_attention", "language_model"}
    assert groups["transformer.decoder.layers.0.multihead_attn.att.in_proj_weight"] == "cross_attention"
    assert groups["transformer.decoder.layers.0.norm2.norm.weight"] == "cross_attention"
    assert groups["transformer.decoder.layers.0.self_attn.att.in_proj_weight"] == "language_model"
    assert groups["transformer.custom_tgt_module.layers.0.emb.Embedding.weight"] == "language_model"
    assert groups["transformer.encoder.layers.0.norm2.norm.weight"] == "encoder"
    assert parameter_group("module.ctc_lin.w.weight") == "ctc"
    with pytest.raises(ValueError, match="new_head.weight is in no learning-rate group"):
        parameter_group("new_head.weight")


def test_weights_load_by_name_into_a_second_build_of_the_graph():
    """Two builds of the graph with the same sizes accept each other's state_dict strictly."""
    source, target = load_graph()["model"], load_graph(dropout=0.0)["model"]
    target.load_state_dict(source.state_dict(), strict=True)
    assert torch.equal(target.ctc_lin.w.weight, source.ctc_lin.w.weight)


def test_graph_included_from_a_recipe_config_takes_its_sizes(tmp_path):
    """A recipe config can !include the graph and pass sizes by !ref."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "vocab_size: 13\n"
        f"graph: !include:{GRAPH_YAML}\n"
        + "".join(f"    {key}: {value}\n" for key, value in TINY.items() if key != "vocab_size")
        + "    vocab_size: !ref <vocab_size>\n"
        "model: !ref <graph[model]>\n"
    )
    with open(recipe) as f:
        hparams = load_hyperpyyaml(f)
    assert hparams["model"] is hparams["graph"]["model"]
    assert hparams["model"].seq_lin.w.out_features == 13


def test_inconsistent_frontend_and_input_size_fails_at_build_time():
    """n_mels not divisible by the front-end stride is reported with the sizes and the rule."""
    with pytest.raises(ValueError, match="n_mels must be divisible"):
        load_graph(n_mels=22)


def test_spec_augment_runs_in_training_mode_only():
    """Eval features are deterministic; training features differ from them (masks, warping)."""
    model = load_graph()["model"]
    wavs, wav_lens = torch.randn(2, 16000), torch.ones(2)
    fit_normalization(model, wavs, wav_lens).train()
    augmented = model.extract_features(wavs, wav_lens)
    model.eval()
    plain = model.extract_features(wavs, wav_lens)
    assert torch.equal(plain, model.extract_features(wavs, wav_lens))
    assert not torch.allclose(plain, augmented)


def test_fbank_computed_by_the_loader_gives_the_same_encoder_states_as_waveforms():
    """fbank_in_loader: the model given the loader's Fbank features [batch, frames, n_mels] computes
    the same encoder states as given the waveforms (only normalization and augmentation run)."""
    wavs, wav_lens = torch.randn(2, 16000), torch.tensor([1.0, 0.5])
    model = fit_normalization(load_graph()["model"], wavs, wav_lens)
    feats = model.compute_features(wavs)
    assert feats.dim() == 3
    assert torch.allclose(model.encode(feats, wav_lens), model.encode(wavs, wav_lens), atol=1e-6)


def test_a_chunked_forward_pass_masks_the_future_and_decodes_as_the_full_one():
    """Under a DynChunkTrainConfig the teacher-forced pass encodes with the chunk mask (its encoder states
    are encode()'s under the same config, not the full-context ones) and trains; a chunk covering every
    frame gives the full-context pass's decoder outputs on the unpadded tokens, so the encode-then-decode
    path is the same decoder as TransformerASR.forward's."""
    from speechbrain.utils.dynamic_chunk_training import DynChunkTrainConfig

    wavs, wav_lens = torch.randn(2, 16000), torch.tensor([1.0, 0.6])
    model = fit_normalization(load_graph(attention_type="RelPosMHAXL")["model"], wavs, wav_lens)
    tokens_bos = torch.tensor([[1, 4, 5], [1, 6, 0]])
    chunked = DynChunkTrainConfig(chunk_size=4, left_context_size=1)
    with torch.no_grad():
        out = model(wavs, wav_lens, tokens_bos, dynchunktrain_config=chunked)
        assert torch.allclose(out.enc_states, model.encode(wavs, wav_lens, dynchunktrain_config=chunked), atol=1e-5)
        assert not torch.allclose(out.enc_states, model.encode(wavs, wav_lens), atol=1e-3)
        whole = model(wavs, wav_lens, tokens_bos, dynchunktrain_config=DynChunkTrainConfig(chunk_size=1000))
        full = model(wavs, wav_lens, tokens_bos)
    assert torch.allclose(whole.seq_log_probs[0], full.seq_log_probs[0], atol=1e-5)
    assert torch.allclose(whole.seq_log_probs[1, :2], full.seq_log_probs[1, :2], atol=1e-5)
    model.train()
    loss = model(wavs, wav_lens, tokens_bos, dynchunktrain_config=chunked).ctc_log_probs.mean()
    loss.backward()
    assert all(p.grad is not None for p in model.transformer.encoder.layers[0].parameters())
