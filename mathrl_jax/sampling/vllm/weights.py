"""The JAX policy's weights as torch tensors under Hugging Face names: what every vLLM sync sends.

`torch_weights` walks the state through the export table of `models/hf.py` (the one that writes Hugging Face
checkpoints). `JaxWeightSource` is the same walk as vLLM's `WeightSource` (`vllm.distributed.weight_transfer`), the
trainer-side input of vLLM's weight-transfer engines; it lives in `transfer.py`, which imports vLLM.
"""

from __future__ import annotations

from typing import Any, Iterator, Tuple

import jax
import numpy as np

from mathrl_jax.models import hf
from mathrl_jax.models.qwen import QwenConfig


def torch_weights(
    state: Any, config: QwenConfig, *, dtype: Any = None, transpose_in_torch: bool = False
) -> Iterator[Tuple[str, Any]]:
    """(Hugging Face name, torch tensor) for every parameter of the JAX `state`, one at a time.

    Tensors are shared with JAX through DLPack: on a GPU they are the same device
    memory. A leaf sharded over several devices is first gathered onto its first
    device (DLPack describes one buffer). `dtype` (a jnp dtype) casts on the JAX
    side first, e.g. float32 training params to vLLM's bfloat16. A state of host
    (numpy) leaves, e.g. gathered from several processes (`distributed.fetch`), is
    taken as it is.

    A linear kernel is `[in, out]` in JAX and `[out, in]` in Hugging Face's layout. By default JAX
    transposes it (a copy on the device, made as the tensor is reached); with `transpose_in_torch` the
    tensor is torch's `.t()` view of the JAX buffer itself: no copy, where no cast or gather is needed
    either (a non-contiguous tensor, which the receiving loader copies as it needs).
    """
    import torch

    for name, spec in hf.parameter_table(config).items():
        array = hf.tensor_value(state, spec)  # a LoRA-adapted projection's merged kernel
        if isinstance(array, np.ndarray):
            array = jax.numpy.asarray(array)
        if spec.transpose and not transpose_in_torch:
            array = array.T
        if dtype is not None and array.dtype != dtype:
            array = array.astype(dtype)
        if len(array.sharding.device_set) > 1:
            array = jax.device_put(array, next(iter(sorted(array.sharding.device_set, key=lambda d: d.id))))
        tensor = torch.from_dlpack(array)
        yield name, tensor.t() if spec.transpose and transpose_in_torch else tensor


def weight_bytes(config: QwenConfig, dtype: Any) -> int:
    """Bytes of one full sync of `config`'s weights in `dtype` (the tensors `torch_weights` yields)."""
    itemsize = np.dtype(dtype).itemsize
    return sum(int(np.prod(spec.shape)) * itemsize for spec in hf.parameter_table(config).values())
