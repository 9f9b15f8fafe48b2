"""Serve a checkpoint with vLLM for `scripts/train.py --config.vllm.server_url=...` (docs/vllm.md).

    python scripts/vllm_server.py --model /ckpt/Qwen2.5-Math-1.5B --port 8000 [--tensor-parallel-size 2]
    python scripts/vllm_server.py --model tiny --port 8000        # the offline default's tiny architecture

It runs vLLM's OpenAI server in the foreground (Ctrl-C stops it) with what the trainer's `VllmServerSampler` needs:
the RLHF weight routes, the token-in token-out generate route, the weight-transfer engine (this package's shared
memory on vLLM's CPU build, vLLM's NCCL on a GPU) and the sampled distribution's log-probs. `--print` prints the
command and its environment instead (to run it yourself, e.g. on the inference machines). The checkpoint's weights
serve until the trainer's first sync replaces them; its architecture must be the trainer's model's. `--model tiny`
writes the offline default's tiny model (`models/tiny.py`) into `--tiny-dir` (by default a new private directory)
and serves it.

It listens on 127.0.0.1 only: the routes the trainer needs are vLLM's development routes, which have no
authentication. `--host 0.0.0.0` (or any address beyond this machine) is refused unless
`--allow-remote-unauthenticated` is given too, on a network you trust (docs/vllm.md#a-server-beyond-localhost).

Exit status 2 with one line for bad input (a missing checkpoint directory, a bad value, vLLM not installed).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv=None) -> int:
    import inspect

    from mathrl_jax.errors import MathRLError
    from mathrl_jax.sampling.vllm.launch import ALLOW_REMOTE_FLAG, check_host, serve_command
    from mathrl_jax.sampling.vllm.sampler import ENGINE_DTYPES

    default = {name: p.default for name, p in inspect.signature(serve_command).parameters.items()}  # defined there
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", required=True, help="a local Hugging Face checkpoint directory, or 'tiny'")
    parser.add_argument(
        "--tiny-dir", default=None, help="where 'tiny' is written (default: a new private temporary directory)"
    )
    parser.add_argument("--port", type=int, default=8000, help="the port it listens on")
    parser.add_argument(
        "--host", default=default["host"], help=f"the address it listens on; beyond localhost needs {ALLOW_REMOTE_FLAG}"
    )
    parser.add_argument(
        ALLOW_REMOTE_FLAG,
        action="store_true",
        help="allow a --host beyond localhost although vLLM's weight routes have no authentication (docs/vllm.md)",
    )
    parser.add_argument("--dtype", default=default["dtype"], choices=ENGINE_DTYPES, help="weights and compute")
    parser.add_argument(
        "--tensor-parallel-size", type=int, default=default["tensor_parallel_size"], help="its worker processes"
    )
    parser.add_argument("--kv-cache-gib", type=float, default=default["kv_cache_gib"], help="the KV cache in GiB")
    parser.add_argument("--max-model-len", type=int, default=None, help="the longest prompt + completion")
    parser.add_argument("--transfer", default=default["transfer"], help="auto | mathrl_shared_memory | nccl")
    parser.add_argument("--seed", type=int, default=default["seed"], help="the engine's (a request's own wins)")
    parser.add_argument("--print", action="store_true", help="print the command instead of running it")
    args, extra = parser.parse_known_args(argv)  # anything else goes to vLLM's server as it is

    from mathrl_jax.sampling.vllm.plugin import TRANSFERS

    problems = [
        (args.tensor_parallel_size >= 1, f"--tensor-parallel-size {args.tensor_parallel_size}: expected >= 1"),
        (args.kv_cache_gib > 0, f"--kv-cache-gib {args.kv_cache_gib}: expected > 0"),
        (0 < args.port < 65536, f"--port {args.port}: expected 1..65535"),
        (args.transfer in TRANSFERS, f"--transfer {args.transfer!r}: expected one of {TRANSFERS}"),
    ]
    for ok, message in problems:
        if not ok:
            parser.exit(2, f"vllm_server.py: error: {message}\n")
    try:
        check_host(args.host, args.allow_remote_unauthenticated)  # before anything is written
    except MathRLError as error:
        parser.exit(2, f"vllm_server.py: error: {error}\n")
    if args.model != "tiny" and not os.path.isfile(os.path.join(args.model, "config.json")):
        what = f"--model {args.model!r} is not a checkpoint directory (no config.json)"
        parser.exit(2, f"vllm_server.py: error: {what}\n")
    try:
        import vllm  # noqa: F401
    except ImportError:
        from mathrl_jax.sampling.vllm import VLLM_MISSING

        parser.exit(2, f"vllm_server.py: error: {VLLM_MISSING} (this Python: {sys.executable})\n")
    model = args.model
    if model == "tiny":
        from mathrl_jax.models import write_tiny_checkpoint

        model = args.tiny_dir or tempfile.mkdtemp(prefix="mathrl_jax_tiny_model_")  # private: mode 0700
        if not os.path.isfile(os.path.join(model, "config.json")):
            write_tiny_checkpoint(model, seed=0)
    command, environment = serve_command(
        model,
        port=args.port,
        host=args.host,
        dtype=args.dtype,
        tensor_parallel_size=args.tensor_parallel_size,
        kv_cache_gib=args.kv_cache_gib,
        max_model_len=args.max_model_len,
        transfer=args.transfer,
        seed=args.seed,
        allow_remote=args.allow_remote_unauthenticated,
        extra=extra,
    )
    if args.print:
        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in environment.items()), shlex.join(command))
        return 0
    os.execvpe(command[0], command, {**os.environ, **environment})


if __name__ == "__main__":
    sys.exit(main())
