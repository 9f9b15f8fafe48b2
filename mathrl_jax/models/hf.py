"""Hugging Face checkpoint interop: one name table, load, export.

`parameter_table(config)` maps every Hugging Face tensor name to its NNX path
and says whether the tensor is transposed (HF `nn.Linear.weight` is
`[out, in]`; an NNX `Linear.kernel` is `[in, out]`). Loading, export and the
vLLM weight sync all go through it.

Loading reads `*.safetensors` files through a memory map, one tensor at a
time, and places each directly on its device (or, given a sharding, each
device's slice of it), so the model is never held twice in host memory. Every
floating tensor is checked finite as it is read (`check_finite_tensor`: a NaN or
inf weight would skip every update of a run, each loss non-finite): one is a
`ModelCheckpointError` naming the tensor and its file.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Callable, Dict, Iterable, Iterator, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mathrl_jax.models import lora
from mathrl_jax.models.hf_config import config_to_dict, load_config
from mathrl_jax.models.qwen import QwenConfig, QwenForCausalLM
from mathrl_jax.models.safetensors_io import (
    ModelCheckpointError,
    SafetensorsFile,
    checkpoint_tensors,
    write_safetensors,
)

Path = Tuple[str, ...]

# Tensors some checkpoints carry that the model derives itself.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)


class Adapter(NamedTuple):
    """The LoRA adapter on a projection: its state paths and scale (`models/lora.py`)."""

    a: Path
    b: Path
    scaling: float


class TensorSpec(NamedTuple):
    path: Path  # NNX state path
    transpose: bool  # HF layout is the transpose of ours
    shape: Tuple[int, ...]  # HF shape
    adapter: Optional[Adapter] = None  # the tensor's LoRA adapter: its HF value is the merged kernel


def parameter_table(config: QwenConfig) -> Dict[str, TensorSpec]:
    """Every HF tensor name of `config`'s architecture -> (NNX path, transpose, HF shape)."""
    c = config
    q_out, kv_out = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    table = {
        "model.embed_tokens.weight": TensorSpec(
            ("model", "embed_tokens", "embedding"), False, (c.vocab_size, c.hidden_size)
        )
    }

    def linear(hf: str, path: Path, n_out: int, n_in: int, bias: bool):
        adapter = None
        if c.adapts(path[-1]):
            adapter = Adapter(path + ("lora", "lora_a"), path + ("lora", "lora_b"), c.lora_alpha / c.lora_rank)
        table[f"{hf}.weight"] = TensorSpec(path + ("kernel",), True, (n_out, n_in), adapter)
        if bias:
            table[f"{hf}.bias"] = TensorSpec(path + ("bias",), False, (n_out,))

    def norm(hf: str, path: Path, dim: int):
        table[f"{hf}.weight"] = TensorSpec(path + ("weight",), False, (dim,))

    for i in range(c.num_hidden_layers):
        hf, path = f"model.layers.{i}", ("model", "layers", i)
        attn, attn_path = f"{hf}.self_attn", path + ("self_attn",)
        linear(f"{attn}.q_proj", attn_path + ("q_proj",), q_out, c.hidden_size, c.attention_bias)
        linear(f"{attn}.k_proj", attn_path + ("k_proj",), kv_out, c.hidden_size, c.attention_bias)
        linear(f"{attn}.v_proj", attn_path + ("v_proj",), kv_out, c.hidden_size, c.attention_bias)
        linear(f"{attn}.o_proj", attn_path + ("o_proj",), c.hidden_size, q_out, False)
        if c.qk_norm:
            norm(f"{attn}.q_norm", attn_path + ("q_norm",), c.head_dim)
            norm(f"{attn}.k_norm", attn_path + ("k_norm",), c.head_dim)
        mlp, mlp_path = f"{hf}.mlp", path + ("mlp",)
        linear(f"{mlp}.gate_proj", mlp_path + ("gate_proj",), c.intermediate_size, c.hidden_size, False)
        linear(f"{mlp}.up_proj", mlp_path + ("up_proj",), c.intermediate_size, c.hidden_size, False)
        linear(f"{mlp}.down_proj", mlp_path + ("down_proj",), c.hidden_size, c.intermediate_size, False)
        norm(f"{hf}.input_layernorm", path + ("input_layernorm",), c.hidden_size)
        norm(f"{hf}.post_attention_layernorm", path + ("post_attention_layernorm",), c.hidden_size)
    norm("model.norm", ("model", "norm"), c.hidden_size)
    if not c.tie_word_embeddings:
        linear("lm_head", ("lm_head",), c.vocab_size, c.hidden_size, False)
    return table


# The exponent bits of each floating safetensors dtype, read as unsigned integers: all ones is an inf or a NaN.
_NON_FINITE_BITS = {
    "BF16": (np.uint16, 0x7F80),
    "F16": (np.uint16, 0x7C00),
    "F32": (np.uint32, 0x7F800000),
    "F64": (np.uint64, 0x7FF0000000000000),
}
_SCAN_CHUNK = 1 << 24  # elements per step of the scan: a bounded temporary, whatever the tensor's size
_FINITE_FILES: set = set()  # (path, size, mtime) of the files whose every floating tensor this process checked


def _file_key(file: SafetensorsFile):
    stat = os.stat(file.path)
    return (os.path.realpath(file.path), stat.st_size, stat.st_mtime_ns)


def check_finite_tensor(file: SafetensorsFile, name: str) -> None:
    """Raises `ModelCheckpointError` naming the tensor `name` of `file` when a value of it is NaN or inf.

    Streams over the memory map in chunks (the exponent bits of each value, as integers), so a large tensor needs
    no copy of itself; integer and bool tensors hold no such value."""
    entry = file.entries[name]
    bits = _NON_FINITE_BITS.get(entry.get("dtype"))
    if bits is None:
        return
    unsigned, mask = bits
    flat = file.get(name).reshape(-1).view(unsigned)
    count = 0
    for begin in range(0, flat.size, _SCAN_CHUNK):
        count += int(np.count_nonzero((flat[begin : begin + _SCAN_CHUNK] & unsigned(mask)) == mask))
    if count:
        raise ModelCheckpointError(
            f"tensor {name!r} in {file.path} holds {count} non-finite value{'s' * (count > 1)} (NaN or inf) of "
            f"{flat.size}: a model with such a weight computes no finite loss (every update would be skipped)"
        )


def check_finite_checkpoint(directory: str) -> None:
    """Every floating tensor of the HF checkpoint in `directory` checked finite (`check_finite_tensor`), one tensor
    at a time; a later `read_tensors` of the same, unchanged files in this process does not check them again."""
    files = {id(f): f for f in checkpoint_tensors(directory).values()}
    for file in files.values():
        key = _file_key(file)
        if key in _FINITE_FILES:
            continue
        for name in file.keys():
            if not name.endswith(_IGNORED_SUFFIXES):  # derived by the model, never read
                check_finite_tensor(file, name)
        _FINITE_FILES.add(key)


def _set_path(tree: dict, path: Path, value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


ShardingFn = Callable[[Path, Tuple[int, ...]], jax.sharding.Sharding]


def read_tensors(
    directory: str,
    table: Dict[str, TensorSpec],
    dtype,
    sharding_fn: Optional[ShardingFn] = None,
    ignore: Callable[[str], bool] = lambda name: False,
) -> dict:
    """Reads every tensor of `table` from a HF checkpoint into a nested pure dict of arrays.

    Raises ModelCheckpointError naming any tensor that is missing, mis-shaped, holds a NaN or inf
    (`check_finite_tensor`), or is in the files but neither in `table` nor ignored.
    """
    located = checkpoint_tensors(directory)
    unexpected = sorted(n for n in located if n not in table and not n.endswith(_IGNORED_SUFFIXES) and not ignore(n))
    if unexpected:
        raise ModelCheckpointError(
            f"{directory}: unexpected tensors (not in this architecture's table): {', '.join(unexpected[:10])}"
            + (f" (and {len(unexpected) - 10} more)" if len(unexpected) > 10 else "")
        )
    missing = sorted(n for n in table if n not in located)
    if missing:
        raise ModelCheckpointError(
            f"{directory}: missing tensors {', '.join(missing[:10])}"
            + (f" (and {len(missing) - 10} more)" if len(missing) > 10 else "")
        )
    dtype = np.dtype(dtype)
    pure: dict = {}
    checked = {id(f) for f in located.values() if _file_key(f) in _FINITE_FILES}
    for name, spec in table.items():
        array = located[name].get(name)
        if id(located[name]) not in checked:
            check_finite_tensor(located[name], name)
        if tuple(array.shape) != spec.shape:
            raise ModelCheckpointError(
                f"{directory}: tensor {name!r} has shape {tuple(array.shape)}, expected {spec.shape}"
            )
        if spec.transpose:
            array = array.T
        sharding = None if sharding_fn is None else sharding_fn(spec.path, array.shape)
        _set_path(pure, spec.path, _to_device(array, dtype, sharding))
    return pure


def load_state(
    directory: str,
    config: QwenConfig,
    sharding_fn: Optional[ShardingFn] = None,
) -> nnx.State:
    """Reads a HF checkpoint into an NNX state of `QwenForCausalLM(config)`.

    Args:
      directory: a local HF checkpoint directory.
      config: the architecture (usually `load_config(directory)`);
        its `param_dtype` is the dtype of the loaded parameters.
      sharding_fn: optional `(nnx_path, shape) -> Sharding`. Each device then
        reads only its own slice of each tensor from the memory map.

    Raises:
      ModelCheckpointError naming the missing, unexpected or mis-shaped tensor.
    """
    return _load_split(directory, config, sharding_fn)[1]


def _load_split(directory: str, config: QwenConfig, sharding_fn: Optional[ShardingFn], lora_seed: int = 0):
    """(graphdef, loaded state) from one abstract trace of the model; LoRA adapters, which a base checkpoint
    does not hold, start at PEFT's initial values (`lora.initialize`, drawn from `lora_seed`)."""
    tied_head = lambda name: config.tie_word_embeddings and name == "lm_head.weight"
    pure = read_tensors(directory, parameter_table(config), config.jnp_param_dtype, sharding_fn, ignore=tied_head)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: QwenForCausalLM(config, rngs=nnx.Rngs(0))))
    nnx.replace_by_pure_dict(state, pure)
    if config.lora_rank:
        state = lora.initialize(state, lora_seed)
    return graphdef, state


def _to_device(array: np.ndarray, dtype: np.dtype, sharding: Optional[jax.sharding.Sharding]) -> jax.Array:
    if sharding is None:
        return jnp.asarray(np.ascontiguousarray(array, dtype=dtype))
    return jax.make_array_from_callback(
        array.shape, sharding, lambda index: np.ascontiguousarray(array[index], dtype=dtype)
    )


def load_model(
    directory: str, sharding_fn: Optional[ShardingFn] = None, lora_seed: int = 0, **config_overrides
) -> QwenForCausalLM:
    """`QwenForCausalLM` with the weights of a local HF checkpoint directory.

    `config_overrides` set run-time fields such as `param_dtype="bfloat16"`,
    `dtype="bfloat16"`, `remat=True` or `lora_rank=8, lora_targets=("q_proj", "v_proj")` (fresh adapters drawn
    from `lora_seed`).
    """
    config = load_config(directory, **config_overrides)
    return nnx.merge(*_load_split(directory, config, sharding_fn, lora_seed))


# ---------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------


def get_path(state, path: Path) -> jax.Array:
    """The array at an NNX state path."""
    node = state
    for key in path:
        node = node[key]
    return node[...] if isinstance(node, nnx.Variable) else node


def tensor_value(state, spec: TensorSpec) -> jax.Array:
    """The array a Hugging Face tensor holds, in our layout: the state's, with a LoRA adapter merged in."""
    value = get_path(state, spec.path)
    if spec.adapter is None:
        return value
    a, b = get_path(state, spec.adapter.a), get_path(state, spec.adapter.b)
    return lora.merged_kernel(value, a, b, spec.adapter.scaling)


def hf_tensors(state: nnx.State, table: Dict[str, TensorSpec]) -> Iterator[Tuple[str, jax.Array]]:
    """(HF name, array in HF layout) for every tensor of `table`, one at a time, as JAX arrays.

    The arrays stay where the state lives (device, sharding) and each transpose
    is made only when its tensor is reached. The export's conversion; the vLLM
    sync walks the same table (`sampling.vllm.torch_weights`), optionally leaving
    the transposes to torch views. An adapted projection's tensor is its merged kernel.
    """
    for name, spec in table.items():
        value = tensor_value(state, spec)
        yield name, (value.T if spec.transpose else value)


def write_checkpoint(
    tensors: Iterable[Tuple[str, jax.Array]],
    hf_config: dict,
    directory: str,
    dtype,
    tokenizer_dir: Optional[str] = None,
    max_shard_bytes: int = 4 * 1024**3,
) -> None:
    """Writes (name, array) pairs as safetensors shards plus `config.json` (and tokenizer files).

    Tensors are fetched to the host one at a time and a shard is written as soon
    as it is full, so at most one shard is held in host memory.
    """
    os.makedirs(directory, exist_ok=True)
    dtype = np.dtype(dtype)
    written, current, current_bytes, total = [], {}, 0, 0

    def flush():
        path = os.path.join(directory, f"model-part-{len(written) + 1:05d}.safetensors")
        write_safetensors(path, current)
        written.append((path, list(current)))

    for name, value in tensors:
        array = np.asarray(jax.device_get(value)).astype(dtype, copy=False)
        if current and current_bytes + array.nbytes > max_shard_bytes:
            flush()
            current, current_bytes = {}, 0
        current[name] = array
        current_bytes += array.nbytes
        total += array.nbytes
    flush()
    for stale in ("model.safetensors", "model.safetensors.index.json"):
        if os.path.exists(os.path.join(directory, stale)):
            os.remove(os.path.join(directory, stale))
    if len(written) == 1:
        os.replace(written[0][0], os.path.join(directory, "model.safetensors"))
    else:
        weight_map = {}
        for i, (path, names) in enumerate(written):
            filename = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
            os.replace(path, os.path.join(directory, filename))
            weight_map.update({name: filename for name in names})
        with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2)
    if tokenizer_dir is not None and os.path.abspath(tokenizer_dir) != os.path.abspath(directory):
        for filename in TOKENIZER_FILES:
            source = os.path.join(tokenizer_dir, filename)
            if os.path.isfile(source):
                shutil.copy(source, os.path.join(directory, filename))


def export_checkpoint(
    state: nnx.State,
    config: QwenConfig,
    directory: str,
    *,
    tokenizer_dir: Optional[str] = None,
    max_shard_bytes: int = 4 * 1024**3,
) -> None:
    """Writes a `QwenForCausalLM` state as a HF checkpoint directory that transformers and vLLM load.

    Tensors are saved in `config.param_dtype`, in files of at most
    `max_shard_bytes` (with `model.safetensors.index.json` when there are
    several). The tokenizer files of `tokenizer_dir` are copied alongside.
    """
    write_checkpoint(
        hf_tensors(state, parameter_table(config)),
        config_to_dict(config),
        directory,
        config.jnp_param_dtype,
        tokenizer_dir,
        max_shard_bytes,
    )
