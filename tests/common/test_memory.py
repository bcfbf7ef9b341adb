"""common/memory.py: the training-memory estimate of a batch, measured on the model itself."""

import torch

from common.memory import saved_activation_bytes, training_memory
from tests.common.test_models import fit_normalization, load_graph


def test_activations_scale_with_the_batch_and_grow_with_length_and_the_model_is_left_as_it_was():
    """Twice the utterances = twice the activations; a longer utterance saves more (at least linearly);
    the measurement changes neither the model's mode nor its normalisation statistics."""
    model = load_graph()["model"]
    fit_normalization(model, torch.randn(2, 16000), torch.ones(2)).train()
    statistics = {k: v.clone() for k, v in model.normalize.state_dict().items() if torch.is_tensor(v)}
    one, two = training_memory(model, 2.0, 1, 10), training_memory(model, 4.0, 2, 10)
    assert two["activations_gib"] == 2 * one["activations_gib"] > 0
    assert saved_activation_bytes(model, 4.0, 10) >= 1.9 * saved_activation_bytes(model, 2.0, 10)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert one["states_gib"] == 16 * trainable / 2**30
    assert model.training
    after = {k: v for k, v in model.normalize.state_dict().items() if torch.is_tensor(v)}
    assert all(torch.equal(statistics[k], after[k]) for k in statistics)


def test_the_estimate_is_of_the_order_of_the_real_autograd_graph():
    """The counted bytes are within a factor of two of the bytes a real training-mode pass keeps alive
    for backward (the storages reachable from the loss' graph)."""
    model = load_graph()["model"]
    fit_normalization(model, torch.randn(2, 16000), torch.ones(2))
    counted = saved_activation_bytes(model, 3.0, 12)
    model.train()
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = model(0.05 * torch.randn(1, 48000), torch.ones(1), torch.ones(1, 13, dtype=torch.long))
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    real = sum(size for pointer, size in storages.items() if pointer not in parameters)
    assert out.ctc_log_probs.requires_grad and 0.5 * real <= counted <= 2 * real


def test_a_model_before_its_first_update_is_measured_without_touching_its_state_or_the_random_stream():
    """Global feature statistics not yet fitted (a run's start) are no obstacle, stay unfitted, and the
    torch random stream continues as if nothing had been measured (training stays reproducible)."""
    model = load_graph(normalize_type="global")["model"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    assert training_memory(model, 2.0, 2, 8)["activations_gib"] > 0
    assert torch.equal(torch.rand(3), expected)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
