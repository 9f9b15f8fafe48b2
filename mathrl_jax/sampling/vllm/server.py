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

import numpy as np

from mathrl_jax.errors import MathRLError
from mathrl_jax.models.qwen import QwenConfig
from mathrl_jax.sampling.vllm.requests import Completion
from mathrl_jax.sampling.vllm.sampler import ENGINE_DTYPES, EngineSampler

START_IT = "start one with `python scripts/vllm_server.py --model <checkpoint> --port <port>` (docs/vllm.md)"


def is_server_url(text: str) -> bool:
    """Whether `text` is a server address this sampler takes: http(s)://host:port, nothing after."""
    return bool(re.match(r"^https?://[^/\s]+/?$", text or ""))


class ServerError(MathRLError, RuntimeError):
    """The vLLM server is unreachable, refuses a request, or was started without what the sampler needs."""


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """What a server told `describe_server`."""

    url: str
    model: str
    max_model_len: int
    dtype: str
    world_size: int


def describe_server(
    server_url: str, *, timeout_s: float = 600.0, max_model_len: Optional[int] = None, dtype: Optional[str] = None
) -> ServerInfo:
    """Checks that the server at `server_url` answers and has what a `VllmServerSampler` needs (the weight routes,
    token-in token-out generation, `max_model_len` tokens a sequence, the weights in `dtype` if given); raises
    `ServerError` naming what is missing. Sends one 1-token generation."""
    import requests

    if not is_server_url(server_url):
        raise ServerError(f"vllm server_url={server_url!r}: expected http://host:port")
    url = server_url.rstrip("/")
    where = f"the vLLM server at {url}"
    with requests.Session() as session:

        def get(path: str, what: str):
            try:
                response = session.get(url + path, timeout=min(timeout_s, 30.0))
            except requests.RequestException as error:
                raise ServerError(f"{where} did not answer ({what}): {_short(error)}; {START_IT}") from None
            if response.status_code == 404:
                return None
            _check(response, f"{where} refused {what} ({path})")
            return response.json() if path != "/health" else {}

        get("/health", "its health check")
        if get("/weight_info", "its weight routes") is None:
            raise ServerError(f"{where} has no weight routes: start it with VLLM_SERVER_DEV_MODE=1; {START_IT}")
        served = get("/v1/models", "its model list")["data"][0]
        if max_model_len is not None and served["max_model_len"] < max_model_len:
            raise ServerError(
                f"{where} serves up to {served['max_model_len']} tokens a sequence (--max-model-len), the run "
                f"needs {max_model_len} (max_prompt_length + max_new_tokens)"
            )
        found = re.search(r"dtype=torch\.(\w+)", get("/server_info", "its configuration")["vllm_config"])
        server_dtype = found.group(1) if found else "float32"
        if server_dtype not in ENGINE_DTYPES:
            raise ServerError(f"{where} runs {server_dtype!r}, expected one of {ENGINE_DTYPES}")
        if dtype not in (None, server_dtype):
            raise ServerError(f"vllm dtype={dtype!r}, but {where} runs {server_dtype!r}: set it to {server_dtype!r}")
        world_size = int(get("/get_world_size?include_dp=false", "its world size")["world_size"])
        body = {"token_ids": [0], "sampling_params": {"max_tokens": 1, "temperature": 0.0}}
        try:
            response = session.post(url + "/inference/v1/generate", json=body, timeout=timeout_s)
        except requests.RequestException as error:
            raise ServerError(f"{where} did not answer a 1-token generation: {_short(error)}") from None
        if response.status_code in (403, 404):
            raise ServerError(f"{where} has no /inference/v1/generate: start it with --enable-scale-out; {START_IT}")
        _check(response, f"{where} refused a 1-token generation")
    return ServerInfo(url, served["id"], int(served["max_model_len"]), server_dtype, world_size)


class VllmServerSampler(EngineSampler):
    """`Sampler` over a vLLM server reached at `server_url`.

    Args:
      server_url: the server's address, e.g. "http://127.0.0.1:8000".
      config: the JAX model's config (the export table of the sync); the server's model must have its architecture.
      eos_token_ids: tokens that end a completion, as the `JaxSampler`'s.
      tokenizer: decodes completions into `Rollouts.texts` (the server answers in token ids).
      dtype: the weights' dtype on the wire; None: the server's own. Another than the server's is refused.
      timeout_s: the longest any one request may take (a generation, a sync step) before `ServerError`.
      transfer: the server's weight-transfer engine ("auto": NCCL beside a GPU trainer, else shared memory).
      transfer_chunk_bytes: the most one step of that transfer holds (None: its default, 1 GiB).
      max_model_len: the longest prompt + completion the run needs; a server that holds less is refused.
      concurrency: requests in flight at once.
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
        concurrency: int = 64,
    ):
        import requests

        from mathrl_jax.sampling.vllm.transfer import resolve_transfer

        if not timeout_s > 0:
            raise ValueError(f"VllmServerSampler: timeout_s={timeout_s!r}, expected > 0 (seconds)")
        self.server = describe_server(server_url, timeout_s=timeout_s, max_model_len=max_model_len, dtype=dtype)
        self.url = self.server.url
        self.where = f"the vLLM server at {self.url}"
        self.timeout_s = float(timeout_s)
        self.concurrency = int(concurrency)
        self.transfer = resolve_transfer(transfer)
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

    def _post(self, path: str, body: Dict[str, Any], what: str, session=None):
        import requests

        try:
            response = (session or self.session).post(self.url + path, json=body, timeout=self.timeout_s)
        except requests.Timeout:
            raise ServerError(f"{self.where} did not answer {what} within {self.timeout_s:g} s") from None
        except requests.RequestException as error:
            raise ServerError(f"{self.where} did not answer {what}: {_short(error)}") from None
        _check(response, f"{self.where} refused {what}")
        return response.json()

    # ------------------------------------------------------------------ weights

    @contextlib.contextmanager
    def _generation_held(self):
        """vLLM's `/pause` (in-flight requests finish first) until `/resume`: the engine must not run a step while an
        update session is open, where its layers are half-loaded (a generation then crashed the engine core), nor
        stamp a request still in flight with the next version. A trainer that dies mid-sync leaves the server
        paused: other clients wait (and time out naming it) until the next sync resumes it. After a failed sync the
        server resumes with its version saying `incomplete:<v>`, which every sampler here refuses."""
        self._post("/pause?mode=wait", {}, "a pause before the weight sync")
        try:
            yield
        finally:
            self._post("/resume", {}, "the resume after the weight sync")

    def _send(self, state: Any, version: int) -> None:
        import requests

        try:
            engine = self._transfer_engine()
            engine.source.state = state
            try:
                engine.send_weights()
            finally:
                engine.source.state = None
        except requests.RequestException as error:
            detail = _response_text(error)
            raise ServerError(f"{self.where}: the weight sync of version {version} failed: {detail}") from None
        self.bytes_sent = getattr(engine, "bytes_sent", 0)
        self._post("/reset_prefix_cache", {}, "a prefix-cache reset")

    def _transfer_engine(self):
        if self._transfer is None:
            from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient

            from mathrl_jax.sampling.vllm.transfer import JaxWeightSource, open_transfer

            source = JaxWeightSource(self.config, self.dtype)
            client = HTTPVLLMWeightSyncClient(self.url, timeout=self.timeout_s)
            self._transfer = open_transfer(
                self.transfer,
                client,
                source,
                engine_world_size=self.server.world_size,
                chunk_bytes=self.transfer_chunk_bytes,
            )
        return self._transfer

    def _set_engine_version(self, text: str) -> None:
        self._post("/update_weight_version", {"new_version": text}, "a weight-version update")

    # ------------------------------------------------------------------ sampling

    def _complete(self, prompt_ids: List[List[int]], requests_fields: List[Dict[str, Any]]) -> List[List[Completion]]:
        import requests

        session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_maxsize=self.concurrency)
        session.mount("http://", adapter)
        session.mount("https://", adapter)

        def one(index: int) -> List[Completion]:
            body = {"token_ids": prompt_ids[index], "sampling_params": requests_fields[index]}
            answer = self._post("/inference/v1/generate", body, f"generation request {index}", session=session)
            return [_completion(choice) for choice in sorted(answer["choices"], key=lambda c: c["index"])]

        workers = max(1, min(self.concurrency, len(prompt_ids)))
        with session, concurrent.futures.ThreadPoolExecutor(workers) as pool:
            return list(pool.map(one, range(len(prompt_ids))))


def _completion(choice: Dict[str, Any]) -> Completion:
    content = (choice.get("logprobs") or {}).get("content") or []
    return Completion(
        token_ids=[int(t) for t in choice["token_ids"]],
        logprobs=np.array([step["logprob"] for step in content], np.float32),
        finish_reason=choice.get("finish_reason") or "abort",
        stop_reason=choice.get("stop_reason"),
        versions=[span["version"] for span in choice.get("weight_versions") or []],
    )


def _check(response, what: str) -> None:
    if response.status_code >= 400:
        raise ServerError(f"{what}: HTTP {response.status_code}: {response.text[:300]}")


def _response_text(error) -> str:
    response = getattr(error, "response", None)
    if response is not None:
        return f"HTTP {response.status_code}: {response.text[:300]}"
    return _short(error)


def _short(error: BaseException) -> str:
    """The last line of an exception's text (requests nests the socket error in several layers)."""
    text = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    return text[:300]
