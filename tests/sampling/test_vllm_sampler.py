"""The vLLM weight sync's conversion: JAX params to torch tensors under Hugging Face names (no engine needed;
the engine itself is tested in test_vllm_engine.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mathrl_jax import sharding as S
from mathrl_jax.models import hf
from mathrl_jax.sampling.vllm import torch_weights
from tests.models.conftest import VARIANTS, make_torch_model

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_torch_weights_equal_transformers_state_dict(variant, tmp_path):
    reference = make_torch_model(variant)
    reference.save_pretrained(str(tmp_path))
    model = hf.load_model(str(tmp_path))
    converted = dict(torch_weights(nnx.state(model), model.config))
    expected = reference.state_dict()
    if model.config.tie_word_embeddings:  # vLLM ties lm_head itself and skips the name
        expected = {k: v for k, v in expected.items() if k != "lm_head.weight"}
    assert sorted(converted) == sorted(expected)
    for name, tensor in converted.items():
        assert isinstance(tensor, torch.Tensor)
        assert tuple(tensor.shape) == tuple(expected[name].shape), name
        np.testing.assert_array_equal(tensor.numpy(), expected[name].numpy(), err_msg=name)


def test_torch_weights_gather_sharded_leaves_and_cast(tmp_path):
    reference = make_torch_model("qwen2")
    reference.save_pretrained(str(tmp_path))
    model = hf.load_model(str(tmp_path))
    mesh = S.make_mesh({"dp": 1, "fsdp": 4, "tp": 1}, devices=jax.devices()[:4])
    state = S.shard_tree(nnx.state(model), mesh, S.qwen_rules(model.config.num_key_value_heads, 1))
    kernel = state["model"]["layers"][0]["mlp"]["up_proj"]["kernel"][...]
    assert len(kernel.sharding.device_set) > 1  # the test exercises the gather
    converted = dict(torch_weights(state, model.config, dtype=jnp.bfloat16))
    weight = converted["model.layers.0.mlp.up_proj.weight"]
    assert weight.dtype == torch.bfloat16
    expected = reference.state_dict()["model.layers.0.mlp.up_proj.weight"].to(torch.bfloat16)
    assert torch.equal(weight, expected)


@pytest.mark.parametrize("variant", ["qwen2", "qwen3"])
def test_torch_weights_without_jax_side_copies(variant, tmp_path):
    """With `transpose_in_torch` every tensor is a view of its parameter's JAX buffer (same address: zero copies on
    the JAX side, the kernels transposed as torch views) and equals the default conversion, which copies exactly
    the transposed kernels."""
    make_torch_model(variant).save_pretrained(str(tmp_path))
    model = hf.load_model(str(tmp_path))
    state = nnx.state(model)
    table = hf.parameter_table(model.config)
    owner = {name: hf.get_path(state, spec.path).unsafe_buffer_pointer() for name, spec in table.items()}

    def copies(**kwargs):
        converted = dict(torch_weights(state, model.config, **kwargs))
        return converted, sorted(name for name, tensor in converted.items() if tensor.data_ptr() != owner[name])

    views, view_copies = copies(transpose_in_torch=True)
    default, default_copies = copies()
    assert view_copies == []
    assert default_copies == sorted(name for name, spec in table.items() if spec.transpose) != []
    for name, tensor in views.items():
        assert torch.equal(tensor, default[name]), name


@pytest.mark.parametrize("variant, dtype", [("qwen2", "float32"), ("qwen3", "bfloat16")])
def test_the_weight_source_declares_what_it_yields(variant, dtype, tmp_path):
    """vLLM's transfer engines size their buffers from `metadata()` and send what iteration yields: the two agree
    name for name, in order, in dtype and shape, and iteration is the conversion above (a tied embedding once)."""
    pytest.importorskip("vllm", reason="JaxWeightSource is vLLM's WeightSource")
    from mathrl_jax.sampling.vllm import JaxWeightSource

    make_torch_model(variant).save_pretrained(str(tmp_path))
    model = hf.load_model(str(tmp_path))
    source = JaxWeightSource(model.config, dtype)
    with pytest.raises(RuntimeError, match="no state"):
        next(iter(source))
    source.state = nnx.state(model)
    declared = [(m.name, m.dtype, m.shape) for m in source.metadata()]
    yielded = [(name, t.dtype, tuple(t.shape)) for name, t in source]
    assert declared == yielded and len(declared) == len(hf.parameter_table(model.config))
    assert {d for _, d, _ in declared} == {getattr(torch, dtype)}
    again = dict(source)  # re-iterable: a fresh pass each time
    for name, tensor in torch_weights(source.state, model.config, dtype=jnp.dtype(dtype)):
        assert torch.equal(again[name], tensor), name


def test_shared_memory_chunks_keep_order_and_bound_their_bytes():
    pytest.importorskip("vllm", reason="the shared-memory engine is a vLLM weight-transfer engine")
    from mathrl_jax.sampling.vllm.shared_memory import chunk_pairs

    rng = np.random.default_rng(0)
    pairs = [(f"t{i}", torch.zeros(int(n), dtype=torch.float32)) for i, n in enumerate(rng.integers(1, 400, 60))]
    for limit in (1, 100, 1000, 4000, 10**9):
        chunks = list(chunk_pairs(iter(pairs), limit))
        assert [name for chunk in chunks for name, _ in chunk] == [name for name, _ in pairs]
        for chunk in chunks:
            size = sum(t.numel() * 4 for _, t in chunk)
            assert size <= limit or len(chunk) == 1  # a tensor over the limit travels alone
        if limit >= 4 * 400:  # every tensor fits: a chunk ends only where the next would not
            for chunk, following in zip(chunks, chunks[1:]):
                assert sum(t.numel() * 4 for _, t in chunk) + following[0][1].numel() * 4 > limit


def test_the_nccl_transfer_is_set_up_as_vllm_expects_without_a_gpu_to_run_it():
    """What can be checked of the GPU path here: its init info (this process the sender, rank 0 of a group with the
    engine's workers), the choice of engine, and the server command for a GPU machine. The broadcast itself needs
    GPUs and has not run."""
    pytest.importorskip("vllm", reason="vLLM's NCCL engine's init info")
    import json

    from mathrl_jax.sampling.vllm import plugin
    from mathrl_jax.sampling.vllm.launch import serve_command
    from mathrl_jax.sampling.vllm.transfer import init_info, resolve_transfer

    info = init_info("nccl", engine_world_size=4, host="10.0.0.7", chunk_bytes=1 << 28)
    assert (info.backend, info.rank, info.is_sender, info.world_size) == ("nccl", 0, True, 5)
    assert info.master_address == "10.0.0.7" and 0 < info.master_port < 65536
    assert info.packed and info.packed_buffer_size_bytes == 1 << 28
    shared = init_info(plugin.BACKEND, engine_world_size=2)
    assert (shared.backend, shared.rank, shared.chunk_bytes) == (plugin.BACKEND, 0, 1 << 30)
    assert resolve_transfer("auto") == plugin.BACKEND  # an in-process engine's workers share this host
    with pytest.raises(ValueError, match="carrier"):
        resolve_transfer("carrier")
    argv, environment = serve_command("/ckpt", port=8000, tensor_parallel_size=2, on_cpu=False)
    assert json.loads(argv[argv.index("--weight-transfer-config") + 1]) == {"backend": "nccl"}
    assert "--no-enable-chunked-prefill" not in argv and "VLLM_CPU_OMP_THREADS_BIND" not in environment
    assert environment["VLLM_SERVER_DEV_MODE"] == "1" and argv[argv.index("--tensor-parallel-size") + 1] == "2"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "gpu-node-3", ""])
def test_a_server_command_beyond_localhost_needs_allow_remote(host):
    """`serve_command` (what `start_server` and `scripts/vllm_server.py` run) opens vLLM's unauthenticated weight
    routes on the loopback interface alone, unless told otherwise."""
    pytest.importorskip("vllm", reason="the server command")
    from mathrl_jax.errors import MathRLError
    from mathrl_jax.sampling.vllm.launch import serve_command

    with pytest.raises(MathRLError, match=f"--host {host!r} would open the server's unauthenticated weight routes"):
        serve_command("/ckpt", port=8000, host=host, on_cpu=False)
    for extra in (["--host", host], [f"--host={host}"]):  # among vLLM's own arguments
        with pytest.raises(MathRLError, match=f"--host {host!r} would open"):
            serve_command("/ckpt", port=8000, on_cpu=False, extra=extra)
    argv, _ = serve_command("/ckpt", port=8000, host=host, on_cpu=False, allow_remote=True)
    assert argv[argv.index("--host") + 1] == host
    for local in ("127.0.0.1", "127.0.0.2", "localhost", "::1"):
        argv, _ = serve_command("/ckpt", port=8000, host=local, on_cpu=False)
        assert argv[argv.index("--host") + 1] == local
