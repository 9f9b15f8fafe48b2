"""Tiny random Hugging Face checkpoints written with `transformers`, the numerics reference."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 97

VARIANTS = {
    # name: (config class, model class, extra config fields)
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen2_tied": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    # head_dim differs from hidden / heads, as in real Qwen3 checkpoints.
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),
}


def make_torch_model(variant: str, seed: int = 0):
    """A small random transformers model whose logits are O(1) (not the ~0 of the default init)."""
    config_cls, model_cls, extra = VARIANTS[variant]
    config = getattr(transformers, config_cls)(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=10000.0,
        max_position_embeddings=256,
        **extra,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.15, generator=generator)
            else:  # norms around 1, biases around 0
                base = 1.0 if "norm" in name else 0.0
                param.copy_(base + 0.1 * torch.randn(param.shape, generator=generator))
    return model


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """variant -> (directory, torch model) for every variant, written once per session."""
    out = {}
    for variant in VARIANTS:
        directory = str(tmp_path_factory.mktemp(variant))
        model = make_torch_model(variant)
        model.save_pretrained(directory)
        out[variant] = (directory, model)
    return out


def padded_batch(seed=0, batch=3, length=12):
    """Token ids and a mask with a full row, a right-padded row and a left-padded row."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, VOCAB, (batch, length))
    mask = np.ones((batch, length), np.int64)
    mask[1, length - 4 :] = 0
    mask[2, :5] = 0
    return ids, mask


def torch_logits(model, ids, mask=None):
    with torch.no_grad():
        kwargs = {} if mask is None else {"attention_mask": torch.tensor(mask)}
        return model(input_ids=torch.tensor(ids), **kwargs).logits.float().numpy()
