"""Export model parameters to a Hugging Face checkpoint directory.

    python scripts/export_hf.py --params PARAMS --like CHECKPOINT_DIR --out OUT_DIR

PARAMS is a file of parameters saved with
`flax.serialization.msgpack_serialize(nnx.to_pure_dict(nnx.state(model)))`,
or a directory holding one (`params.msgpack`). CHECKPOINT_DIR is the HF
checkpoint the model was built from: its `config.json` gives the
architecture and its tokenizer files are copied. The output loads with
`transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)` and in vLLM.
"""

from __future__ import annotations

import argparse
import os
import sys

from flax import nnx, serialization

from mathrl_jax.models import hf
from mathrl_jax.models.qwen import ConfigError, QwenConfig, QwenForCausalLM


def load_params(path: str) -> dict:
    if os.path.isdir(path):
        path = os.path.join(path, "params.msgpack")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no parameter file at {path!r}")
    with open(path, "rb") as f:
        try:
            return serialization.msgpack_restore(f.read())
        except Exception as e:  # msgpack raises several unrelated types
            raise ValueError(f"{path!r} is not a msgpack parameter file: {e}") from None


def export(params_path: str, like: str, out: str, dtype: str = None) -> None:
    overrides = {"param_dtype": dtype} if dtype else {}
    config = QwenConfig.from_pretrained(like, **overrides)
    state = nnx.state(nnx.eval_shape(lambda: QwenForCausalLM(config, rngs=nnx.Rngs(0))))
    try:
        nnx.replace_by_pure_dict(state, load_params(params_path))
    except (KeyError, ValueError) as e:
        raise ValueError(f"{params_path!r} does not match the {config.architecture} in {like!r}: {e}") from None
    hf.export_checkpoint(state, config, out, tokenizer_dir=like)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", required=True, help="msgpack parameter file (or a directory with params.msgpack)")
    parser.add_argument("--like", required=True, help="HF checkpoint directory with the config.json and tokenizer")
    parser.add_argument("--out", required=True, help="output HF checkpoint directory")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="dtype of the saved tensors")
    args = parser.parse_args(argv)
    try:
        export(args.params, args.like, args.out, args.dtype)
    except (ConfigError, hf.CheckpointError, FileNotFoundError, ValueError) as e:
        print(f"export_hf: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
