"""Peak host memory of loading a Hugging Face checkpoint into a sharded state.

Writes a Qwen-shaped checkpoint of a few hundred MB (random bf16 weights), then
loads it in fresh subprocesses, each way:

  sharded      models.hf.load_state with the Qwen rules on an fsdp=8 mesh of 8
               simulated CPU devices: each device reads its slice from the
               memory map
  one device   models.hf.load_state without sharding
  baseline     read every tensor into host memory first (safetensors' own
               loader via torch), then jax.device_put with the same shardings

and prints the peak anonymous memory (process heap, sampled every 5 ms) and
the peak RSS (which also counts the memory-mapped file's page cache), each as
a multiple of the checkpoint's size.

    python scripts/bench_sharded_load.py [--hidden 1024 --layers 12 --vocab 32768]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from mathrl_jax.models.hf_config import load_config

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench_sharded_load.py")
"""This benchmark's command line, which its child processes run."""


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class PeakSampler:
    """Samples RssAnon in a thread; VmHWM gives the peak of the whole RSS."""

    def __init__(self):
        self.peak = self.start = _status("RssAnon")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _status("RssAnon"))
            time.sleep(0.005)

    def __enter__(self):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self.rss_start = _status("VmRSS")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _status("RssAnon"))
        self.rss_peak = _status("VmHWM")


def probe(mode, directory):
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax

    from mathrl_jax import sharding as S
    from mathrl_jax.models import hf

    config = load_config(directory, param_dtype="bfloat16", dtype="bfloat16")
    mesh = S.make_mesh({"dp": 1, "fsdp": 8, "tp": 1})
    sharding_fn = S.loader_sharding_fn(mesh, S.qwen_rules(config.num_key_value_heads, 1))
    jax.block_until_ready(jax.numpy.zeros(1))  # runtime start-up outside the measurement
    with PeakSampler() as sampler:
        if mode == "sharded":
            state = hf.load_state(directory, config, sharding_fn)
        elif mode == "one device":
            state = hf.load_state(directory, config)
        else:
            from safetensors.torch import load_file

            tensors = {
                k: v.float().numpy().astype(jax.numpy.bfloat16)
                for k, v in load_file(os.path.join(directory, "model.safetensors")).items()
            }
            state = {}
            for name, spec in hf.parameter_table(config).items():
                array = tensors[name].T if spec.transpose else tensors[name]
                state[name] = jax.device_put(array, sharding_fn(spec.path, array.shape))
        jax.block_until_ready(jax.tree.leaves(state))
    print(json.dumps({"anon_peak": sampler.peak - sampler.start, "rss_peak": sampler.rss_peak - sampler.rss_start}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--probe", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe(*args.probe)
        return

    import jax
    from flax import nnx

    from mathrl_jax.models import QwenConfig, QwenForCausalLM, hf

    config = QwenConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=2,
        head_dim=64,
        param_dtype="bfloat16",
        dtype="bfloat16",
    )
    with tempfile.TemporaryDirectory() as directory:
        state = nnx.state(QwenForCausalLM(config, rngs=nnx.Rngs(0)))
        hf.export_checkpoint(state, config, directory, max_shard_bytes=2**40)
        del state
        size = os.path.getsize(os.path.join(directory, "model.safetensors"))
        print(
            f"# bench_sharded_load: checkpoint {size / 1e6:.0f} MB (bf16, hidden {args.hidden}, "
            f"{args.layers} layers, vocab {args.vocab}); 8 simulated CPU devices, fsdp=8; jax {jax.__version__}\n"
        )
        print("| load | peak heap / checkpoint | peak RSS incl. page cache / checkpoint |")
        print("|---|---:|---:|")
        for mode in ("sharded", "one device", "baseline"):
            out = subprocess.run(
                [sys.executable, SCRIPT, "--probe", mode, directory],
                capture_output=True,
                text=True,
                check=True,
            )
            m = json.loads(out.stdout.strip().splitlines()[-1])
            label = {"baseline": "baseline: whole tensors in host memory, then device_put"}.get(mode, mode)
            print(f"| {label} | {m['anon_peak'] / size:.2f}x | {m['rss_peak'] / size:.2f}x |")


if __name__ == "__main__":
    main()
