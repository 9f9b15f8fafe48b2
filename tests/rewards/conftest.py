"""A tiny random PRM checkpoint over the project's character tokenizer, written with `transformers`."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def prm_checkpoint(tmp_path_factory):
    """(directory, torch model): a 2-layer Qwen2 causal LM with O(1) logits, saved with the char tokenizer."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from mathrl_jax.models import char_tokenizer

    config = transformers.Qwen2Config(
        vocab_size=char_tokenizer.vocab_size(),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=10000.0,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # weights large enough that P(good) varies from step to step
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.15, generator=generator)
            else:
                base = 1.0 if "norm" in name else 0.0
                param.copy_(base + 0.1 * torch.randn(param.shape, generator=generator))
    directory = str(tmp_path_factory.mktemp("prm"))
    model.save_pretrained(directory)
    char_tokenizer.save_char_tokenizer(directory)
    return directory, model
