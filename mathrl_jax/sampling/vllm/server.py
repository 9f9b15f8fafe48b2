"""`VllmServerSampler`: rollouts from a vLLM server in its own process (or on its own machines), synced over HTTP.

    python scripts/vllm_server.py --model /ckpt/Qwen2.5-Math-1.5B --port 8000        # or your own `vllm serve`
    sampler = VllmServerSampler("http://127.0.0.1:8000", config=model.config, eos_token_ids=[eos])
    sampler.update_weights(train_state.params, version=step)
    rollouts = sampler.generate(prompt_ids, SamplingParams(n=8, temperature=1.0, max_new_tokens=1024))

What the server must have been started with (`launch.serve_command` writes it):

- `VLLM_SERVER_DEV_MODE=1`: vLLM's RLHF routes (`/init_weight_transfer_engine`, `/start_weight_update`,
  `/update_weights`, `/finish_weight_update`, `/update_weight_version`, `/weight_info`);
- `--enable-scale-out`: the token-in, token-out route `/inference/v1/generate` (token ids in; token ids, each
  sampled token's log-prob and the weight versions that sampled them out);
- `--weight-transfer-config '{"backend": ...}'`: the engine that receives the weights: this package's shared-memory
  engine on the trainer's host (`shared_memory.py`; the server's vLLM must have mathrl_jax installed, for its entry
  point), or vLLM's `nccl` for GPU servers anywhere (written from vLLM 0.32, not run: no GPU here);
- `--logprobs-mode processed_logprobs`: the log-probs of the distribution sampled from, as the other samplers'.

Generation: one request a prompt, `concurrency` at a time (the server batches them), each request bounded by
`timeout_s`. A server that is gone, refuses, or does not answer in time raises `ServerError`, which names it (a
`MathRLError`: `scripts/train.py` stops with exit status 2 and that line; the last checkpoint is intact and a rerun
resumes). The weights go through vLLM's weight-transfer protocol (`transfer.py`); versions and their checks are
`EngineSampler`'s.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import re
from typing import Any, Dict, List, Optional, Sequence

from mathrl_jax.models.qwen import QwenConfig
from mathrl_jax.sampling.vllm.answers import (  # noqa: F401 - LOGPROB_TOLERANCE: this module's name of it too
    LOGPROB_TOLERANCE,
    ServerError,
    check_status,
    completions,
    field,
    json_body,
    response_text,
    shape,
    short,
)
from mathrl_jax.sampling.vllm.requests import Completion
from mathrl_jax.sampling.vllm.sampler import ENGINE_DTYPES, EngineSampler

START_IT = "start one with `python scripts/vllm_server.py --model <checkpoint> --port <port>` (docs/vllm.md)"
QUERY_TIMEOUT_S = 30.0  # a question about the server (health, configuration) needs no generation's time
CLEANUP_TIMEOUT_S = 10.0  # the resume after a failed sync: a server that did not answer the sync may not answer it
CONCURRENCY = 64  # generation requests in flight at once (the server batches them)


def is_server_url(text: str) -> bool:
    """Whether `text` is a server address this sampler takes: http(s)://host:port, nothing after."""
    return bool(re.match(r"^https?://[^/\s]+/?$", text or ""))


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """What a server told `describe_server`."""

    url: str
    model: str
    max_model_len: int
    dtype: str
    world_size: int  # its workers (tensor x pipeline parallel)
    transfer: str  # its weight-transfer engine


def describe_server(
    server_url: str,
    *,
    timeout_s: float = 600.0,
    max_model_len: Optional[int] = None,
    dtype: Optional[str] = None,
    transfer: str = "auto",
) -> ServerInfo:
    """Checks that the server at `server_url` answers and has what a `VllmServerSampler` needs: the weight routes
    (`VLLM_SERVER_DEV_MODE=1`), token-in token-out generation (`--enable-scale-out`), a weight-transfer engine (the
    one `transfer` names, unless "auto"), the sampled distribution's log-probs (`--logprobs-mode
    processed_logprobs`), `max_model_len` tokens a sequence, the weights in `dtype` if given. Raises `ServerError`
    naming what is missing. Sends one 1-token generation. (The architecture is the first sync's to check: a
    tensor of another shape fails it, named by the engine.)"""
    import requests

    if not is_server_url(server_url):
        raise ServerError(f"vllm server_url={server_url!r}: expected http://host:port")
    url = server_url.rstrip("/")
    where = f"the vLLM server at {url}"
    with requests.Session() as session:

        def get(path: str, what: str):
            try:
                response = session.get(url + path, timeout=min(timeout_s, QUERY_TIMEOUT_S))
            except requests.RequestException as error:
                raise ServerError(f"{where} did not answer ({what}): {short(error)}; {START_IT}") from None
            if response.status_code == 404:
                return None
            check_status(response, f"{where} refused {what} ({path})")
            return json_body(response, f"{where} answered {what} ({path})") if path != "/health" else {}

        get("/health", "its health check")
        if get("/weight_info", "its weight routes") is None:
            raise ServerError(f"{where} has no weight routes: start it with VLLM_SERVER_DEV_MODE=1; {START_IT}")
        models = f"{where} answered its model list (/v1/models)"
        listed = field(get("/v1/models", "its model list"), ("data",), list, models)
        if not listed:
            raise ServerError(f"{models} with no model")
        served_id = field(listed[0], ("id",), str, models)
        served_len = field(listed[0], ("max_model_len",), int, models)
        if max_model_len is not None and served_len < max_model_len:
            raise ServerError(
                f"{where} serves up to {served_len} tokens a sequence (--max-model-len), the run "
                f"needs {max_model_len} (max_prompt_length + max_new_tokens)"
            )
        configuration = f"{where} answered its configuration (/server_info)"
        info = get("/server_info?config_format=json", "its configuration")
        described = field(info, ("vllm_config",), dict, configuration)
        model = field(info, ("vllm_config", "model_config"), dict, configuration)
        server_dtype = field(info, ("vllm_config", "model_config", "dtype"), str, configuration).removeprefix("torch.")
        if server_dtype not in ENGINE_DTYPES:
            raise ServerError(f"{where} runs {server_dtype!r}, expected one of {ENGINE_DTYPES}")
        if dtype not in (None, server_dtype):
            raise ServerError(f"vllm dtype={dtype!r}, but {where} runs {server_dtype!r}: set it to {server_dtype!r}")
        if model.get("logprobs_mode") != "processed_logprobs":
            raise ServerError(
                f"{where} reports {model.get('logprobs_mode')!r} log-probs, not those of the distribution it samples "
                f"from: start it with --logprobs-mode processed_logprobs; {START_IT}"
            )
        transfer_config = described.get("weight_transfer_config") or {}
        backend = transfer_config.get("backend") if isinstance(transfer_config, dict) else None
        if backend is not None and not isinstance(backend, str):
            raise ServerError(f"{configuration} with a weight-transfer backend of {shape(backend)}, expected a name")
        if backend is None:
            raise ServerError(
                f"{where} has no weight-transfer engine: start it with --weight-transfer-config; {START_IT}"
            )
        if transfer not in ("auto", backend):
            raise ServerError(f"vllm transfer={transfer!r}, but {where} was started with the {backend!r} engine")
        world_size = field(info, ("vllm_config", "parallel_config", "world_size"), int, configuration)
        if world_size < 1:
            raise ServerError(f"{configuration} with world_size {world_size}, expected >= 1")
        body = {"token_ids": [0], "sampling_params": {"max_tokens": 1, "temperature": 0.0}}
        try:
            response = session.post(url + "/inference/v1/generate", json=body, timeout=timeout_s)
        except requests.RequestException as error:
            raise ServerError(f"{where} did not answer a 1-token generation: {short(error)}") from None
        if response.status_code in (403, 404):
            raise ServerError(f"{where} has no /inference/v1/generate: start it with --enable-scale-out; {START_IT}")
        check_status(response, f"{where} refused a 1-token generation")
    return ServerInfo(url, served_id, served_len, server_dtype, world_size, backend)


class VllmServerSampler(EngineSampler):
    """`Sampler` over a vLLM server reached at `server_url`.

    Args:
      server_url: the server's address, e.g. "http://127.0.0.1:8000".
      config: the JAX model's config (the export table of the sync); the server's model must have its architecture.
      eos_token_ids: tokens that end a completion, as the `JaxSampler`'s.
      tokenizer: decodes completions into `Rollouts.texts` (the server answers in token ids).
      dtype: the weights' dtype on the wire; None: the server's own. Another than the server's is refused.
      timeout_s: the longest any one request may take (a generation, a sync step) before `ServerError`.
      transfer: the server's weight-transfer engine: "auto" takes the one it was started with; another is refused.
      transfer_chunk_bytes: the most one step of that transfer holds (None: its default, 1 GiB).
      max_model_len: the longest prompt + completion the run needs; a server that holds less is refused.
      concurrency: requests in flight at once.

    One trainer syncs a server (the processes of one run: process 0); a second one syncing it meanwhile is detected
    (`EngineSampler`), not shared.
    """

    def __init__(
        self,
        server_url: str,
        *,
        config: QwenConfig,
        eos_token_ids: Sequence[int] = (),
        tokenizer: Any = None,
        dtype: Optional[str] = None,
        timeout_s: float = 600.0,
        transfer: str = "auto",
        transfer_chunk_bytes: Optional[int] = None,
        max_model_len: Optional[int] = None,
        concurrency: int = CONCURRENCY,
    ):
        import requests

        if not timeout_s > 0:
            raise ValueError(f"VllmServerSampler: timeout_s={timeout_s!r}, expected > 0 (seconds)")
        self.server = describe_server(
            server_url, timeout_s=timeout_s, max_model_len=max_model_len, dtype=dtype, transfer=transfer
        )
        self.url = self.server.url
        self.where = f"the vLLM server at {self.url}"
        self.timeout_s = float(timeout_s)
        self.concurrency = int(concurrency)
        self.transfer = self.server.transfer
        self.transfer_chunk_bytes = transfer_chunk_bytes
        self.session = requests.Session()
        super().__init__(
            config, eos_token_ids=eos_token_ids, tokenizer=tokenizer, dtype=self.server.dtype, synced_version=None
        )
        self.bytes_sent = 0
        self._transfer = None

    def close(self) -> None:
        """Ends this trainer's weight transfer (the server keeps running)."""
        if self._transfer is not None:
            self._transfer.shutdown()
            self._transfer = None

    # ------------------------------------------------------------------ HTTP

    def _request(self, method: str, path: str, what: str, body=None, session=None, timeout=None):
        import requests

        timeout = self.timeout_s if timeout is None else timeout
        try:
            response = (session or self.session).request(method, self.url + path, json=body, timeout=timeout)
        except requests.Timeout:
            raise ServerError(f"{self.where} did not answer {what} within {timeout:g} s") from None
        except requests.RequestException as error:
            raise ServerError(f"{self.where} did not answer {what}: {short(error)}") from None
        check_status(response, f"{self.where} refused {what}")
        return json_body(response, f"{self.where} answered {what}")

    # ------------------------------------------------------------------ weights

    @contextlib.contextmanager
    def _generation_held(self):
        """vLLM's `/pause` (in-flight requests finish first) until `/resume`: the engine must not run a step while an
        update session is open, where its layers are half-loaded (a generation then crashed the engine core), nor
        stamp a request still in flight with the next version. A trainer that dies mid-sync leaves the server
        paused: other clients wait (and time out naming it) until the next sync resumes it. After a failed sync the
        server is resumed (briefly tried: it may be the one that failed) with its weights labelled `incomplete:`,
        which every sampler here refuses; the sync's own error is the one raised."""
        self._request("POST", "/pause?mode=wait", "a pause before the weight sync")
        try:
            yield
        except BaseException:
            try:
                self._request("POST", "/resume", "a resume after the failed sync", timeout=CLEANUP_TIMEOUT_S)
            except ServerError:
                pass
            raise
        self._request("POST", "/resume", "the resume after the weight sync")

    def _send(self, state: Any, version: int) -> None:
        import requests

        from mathrl_jax.sampling.vllm.shared_memory import EngineLoadError

        try:
            engine = self._transfer_engine()
            engine.source.state = state
            try:
                engine.send_weights()
            finally:
                engine.source.state = None
        except requests.Timeout:
            raise ServerError(
                f"{self.where} did not answer the weight sync of version {version} within {self.timeout_s:g} s"
            ) from None
        except requests.RequestException as error:
            detail = response_text(error)
            raise ServerError(f"{self.where}: the weight sync of version {version} failed: {detail}") from None
        except EngineLoadError as error:
            raise ServerError(
                f"{self.where} could not load the weights of version {version} (is its model the policy's "
                f"architecture?): {error}"
            ) from None
        self.bytes_sent = getattr(engine, "bytes_sent", 0)
        self._request("POST", "/reset_prefix_cache", "a prefix-cache reset")

    def _transfer_engine(self):
        if self._transfer is None:
            from urllib.parse import urlparse

            from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient

            from mathrl_jax.sampling.vllm.transfer import JaxWeightSource, address_facing, open_transfer

            source = JaxWeightSource(self.config, self.dtype)
            client = HTTPVLLMWeightSyncClient(self.url, timeout=self.timeout_s)
            self._transfer = open_transfer(
                self.transfer,
                client,
                source,
                engine_world_size=self.server.world_size,
                host=address_facing(urlparse(self.url).hostname),  # where the server's workers reach this process
                chunk_bytes=self.transfer_chunk_bytes,
            )
        return self._transfer

    def _set_engine_version(self, text: str) -> None:
        self._request("POST", "/update_weight_version", "a weight-version update", body={"new_version": text})

    def _engine_version(self) -> str:
        answer = self._request("GET", "/weight_info", "a weight-version query")
        return field(answer, ("weight_version",), str, f"{self.where} answered a weight-version query")

    # ------------------------------------------------------------------ sampling

    def _complete(self, prompt_ids: List[List[int]], requests_fields: List[Dict[str, Any]]) -> List[List[Completion]]:
        import requests

        session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_maxsize=self.concurrency)
        session.mount("http://", adapter)
        session.mount("https://", adapter)

        def one(index: int) -> List[Completion]:
            body = {"token_ids": prompt_ids[index], "sampling_params": requests_fields[index]}
            what = f"generation request {index}"
            answer = self._request("POST", "/inference/v1/generate", what, body, session)
            return completions(answer, requests_fields[index], self.config.vocab_size, f"{self.where} answered {what}")

        workers = max(1, min(self.concurrency, len(prompt_ids)))
        with session, concurrent.futures.ThreadPoolExecutor(workers) as pool:
            return list(pool.map(one, range(len(prompt_ids))))
