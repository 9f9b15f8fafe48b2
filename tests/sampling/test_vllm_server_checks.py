"""`describe_server`'s refusals, each naming what the server lacks, before a run writes anything; and the sampler's
refusal of any answer it cannot vouch for (token ids outside the vocabulary, log-probs that are not one a token or
not log-probabilities, `{}`, an HTML page): a `ServerError` naming the server, never a rollout. The server here is
a stand-in that answers vLLM 0.32's routes with a real server's JSON (as `tests/sampling/test_vllm_modes.py`'s real
server gave it), one piece changed per case: a real server per case would cost ~20 s each, and the real server's
acceptance is tested there."""

import http.server
import json
import threading

import pytest

from mathrl_jax.errors import MathRLError
from mathrl_jax.models.tiny import tiny_config
from mathrl_jax.sampling import SamplingParams
from mathrl_jax.sampling.vllm.server import ServerError, VllmServerSampler, describe_server
from tests.sampling.conftest import free_port

pytest.importorskip("requests")

GOOD = {
    "/health": {},
    "/weight_info": {"weight_version": "default"},
    "/v1/models": {"data": [{"id": "/ckpt", "max_model_len": 1024}]},
    "/server_info?config_format=json": {
        "vllm_config": {
            "model_config": {"dtype": "torch.float32", "logprobs_mode": "processed_logprobs"},
            "weight_transfer_config": {"backend": "mathrl_shared_memory"},
            "parallel_config": {"world_size": 2},
        }
    },
}


HTML = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>\n"


def serve(answers, generate_status=200, generate=lambda: {"choices": []}):
    """The stand-in: `answers` by GET path; `generate()` the body of every generate (a str: sent as an HTML page)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, status, body):
            html = isinstance(body, str)
            data = body if isinstance(body, bytes) else body.encode() if html else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html" if html else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path in answers:
                self.reply(200, answers[self.path])
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/inference/v1/generate":
                self.reply(generate_status, generate())
            else:
                self.reply(404, {"detail": "Not Found"})

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def changed(path, update):
    answers = json.loads(json.dumps(GOOD))
    if update is None:
        del answers[path]
    else:
        update(answers[path])
    return answers


def config(section, key, value):
    def update(answer):
        answer["vllm_config"][section][key] = value

    return update


INFO = "/server_info?config_format=json"
CASES = {
    "no dev mode": (changed("/weight_info", None), {}, "start it with VLLM_SERVER_DEV_MODE=1"),
    "raw log-probs": (changed(INFO, config("model_config", "logprobs_mode", "raw_logprobs")), {}, "processed_logprobs"),
    "no transfer engine": (
        changed(INFO, lambda a: a["vllm_config"].update(weight_transfer_config=None)),
        {},
        "--weight-transfer-config",
    ),
    "another transfer": (GOOD, {"transfer": "nccl"}, "started with the 'mathrl_shared_memory' engine"),
    "another dtype": (GOOD, {"dtype": "bfloat16"}, "runs 'float32': set it to 'float32'"),
    "too short": (GOOD, {"max_model_len": 2048}, "serves up to 1024 tokens a sequence"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_server_without_what_the_sampler_needs_is_refused_naming_it(case):
    answers, kwargs, named = CASES[case]
    server = serve(answers)
    try:
        with pytest.raises(ServerError, match=named.replace("(", r"\(")):
            describe_server(f"http://127.0.0.1:{server.server_port}", timeout_s=5, **kwargs)
    finally:
        server.shutdown()


def test_a_server_without_token_generation_is_refused_and_a_complete_one_described():
    server = serve(GOOD, generate_status=403)
    try:
        with pytest.raises(ServerError, match="start it with --enable-scale-out"):
            describe_server(f"http://127.0.0.1:{server.server_port}", timeout_s=5)
    finally:
        server.shutdown()
    server = serve(GOOD)
    try:
        info = describe_server(f"http://127.0.0.1:{server.server_port}", timeout_s=5, max_model_len=1024)
    finally:
        server.shutdown()
    assert (info.model, info.max_model_len, info.dtype, info.world_size) == ("/ckpt", 1024, "float32", 2)
    assert info.transfer == "mathrl_shared_memory"  # "auto" takes the server's


@pytest.mark.parametrize("url", ["localhost:8000", "http://127.0.0.1:8000/v1", "ftp://host:1"])
def test_an_address_that_is_not_a_servers_is_refused(url):
    with pytest.raises(ServerError, match="expected http://host:port"):
        describe_server(url)


def test_nothing_listening_is_named_at_once():
    with pytest.raises(ServerError, match=r"the vLLM server at http://127.0.0.1:\d+ did not answer"):
        describe_server(f"http://127.0.0.1:{free_port()}", timeout_s=5)


@pytest.mark.parametrize(
    "path, answer, named",
    [
        ("/v1/models", {}, r"answered its model list \(/v1/models\) without 'data' \(the answer is an empty object"),
        ("/v1/models", HTML, r"answered its model list \(/v1/models\) with something other than JSON: '<!DOCTYPE"),
        ("/weight_info", HTML, r"answered its weight routes \(/weight_info\) with something other than JSON"),
        (INFO, {}, r"answered its configuration \(/server_info\) without 'vllm_config'"),
        (
            INFO,
            {"vllm_config": {"model_config": {}}},
            r"answered its configuration \(/server_info\) without "
            r"'vllm_config.model_config.dtype' \(vllm_config.model_config is an empty object\)",
        ),
    ],
)
def test_a_server_answering_empty_json_or_html_is_refused_naming_it(path, answer, named):
    answers = changed(path, None)
    answers[path] = answer
    server = serve(answers)
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        with pytest.raises(ServerError, match=f"^the vLLM server at {url} {named}"):
            describe_server(url, timeout_s=5)
    finally:
        server.shutdown()


VOCAB = tiny_config().vocab_size
N = 2


def answer(token_ids=((5, 6, 7), (8, 9)), logprobs=None, version=None, **choice):
    """A real server's answer to one request of N samples (`version`: the weight-version stamp), `choice`'s fields
    changed in every choice."""
    choices = []
    for index, ids in enumerate(token_ids):
        lps = [-0.5] * len(ids) if logprobs is None else logprobs
        choices.append(
            {
                "index": index,
                "token_ids": list(ids),
                "logprobs": {"content": [{"token_id": t, "logprob": lp, "rank": 1} for t, lp in zip(ids, lps)]},
                "finish_reason": "length",
                "stop_reason": None,
                "weight_versions": [{"version": version, "start": 0, "end": len(ids)}],
                **choice,
            }
        )
    return {"request_id": "x", "choices": choices}


def padded(values, n):
    return list(values) + [-0.5] * (n - len(values))


def each_choice(version, change):
    """`answer(version=version)` with `change(choice)` applied to every choice."""
    whole = answer(version=version)
    for choice in whole["choices"]:
        change(choice)
    return whole


BAD_GENERATIONS = {
    "a token id past the vocabulary": (
        lambda v: answer(token_ids=((5, VOCAB, 7), (8, 9)), version=v),
        rf"choice 0's token ids outside the vocabulary \[0, {VOCAB}\): \[{VOCAB}\]",
    ),
    "a negative token id": (
        lambda v: answer(token_ids=((5, 6, 7), (-1, 9)), version=v),
        r"choice 1's token ids outside the vocabulary .*: \[-1\]",
    ),
    "a token id that is not an integer": (
        lambda v: answer(token_ids=((5, 6.5, 7), (8, 9)), version=v),
        r"choice 0's token ids not all integers: \[6.5\]",
    ),
    "fewer log-probs than tokens": (
        lambda v: each_choice(v, lambda c: c["logprobs"]["content"].pop()),
        r"choice 0's 2 log-probs for 3 tokens",
    ),
    "no log-probs": (
        lambda v: each_choice(v, lambda c: c.update(logprobs=None)),
        r"\(choice 0\) without 'content'",
    ),
    "a log-prob above 0": (
        lambda v: answer(logprobs=padded([0.5], 3), version=v),
        r"choice 0's log-probs not finite and <= 0: \[0.5\]",
    ),
    "an infinite log-prob": (  # valid JSON, which Python reads as -inf
        lambda v: json.dumps(answer(logprobs=padded([-0.25], 3), version=v)).replace("-0.25", "-1e999").encode(),
        r"choice 0's log-probs not finite and <= 0: \[-inf\]",
    ),
    "an integer log-prob past a float": (  # found in review: an OverflowError, a traceback
        lambda v: json.dumps(answer(logprobs=padded([-0.25], 3), version=v)).replace("-0.25", "1" + "0" * 400).encode(),
        r"choice 0's log-probs not finite and <= 0: \[inf\]",
    ),
    "a NaN log-prob": (  # not JSON
        lambda v: answer(logprobs=padded([float("nan")], 3), version=v),
        r"with something other than JSON: '\{\"request_id\": \"x\", \"choices\": \[\{\"index\": 0",
    ),
    "more tokens than asked for": (
        lambda v: answer(token_ids=((5,) * 9, (8, 9)), version=v),
        r"choice 0 of 9 tokens, more than the 4 asked for",
    ),
    "a missing sample": (
        lambda v: {"choices": answer(version=v)["choices"][:1]},
        r"choices indexed \[0\], expected 2 indexed 0..1",
    ),
    "an empty object": (lambda v: {}, r"without 'choices' \(the answer is an empty object\)"),
    "an HTML page": (lambda v: HTML, r"with something other than JSON: '<!DOCTYPE html> <html><head><title>502"),
}


@pytest.mark.parametrize("case", list(BAD_GENERATIONS))
def test_a_generation_the_sampler_cannot_vouch_for_is_a_server_error_naming_the_server(case):
    """Through `VllmServerSampler.generate`, the trainer's path: every malformed answer raises `ServerError` (a
    `MathRLError`: `scripts/train.py` stops with exit status 2 and this line), naming the server; the well-formed
    one beside it is sampled from."""
    make, named = BAD_GENERATIONS[case]
    current = {"answer": lambda: answer()}
    server = serve(GOOD, generate=lambda: current["answer"]())
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        sampler = VllmServerSampler(url, config=tiny_config(), timeout_s=5)
        sampler.expect_weights(3)  # as if synced: the stand-in stamps its answers with this label
        label = f"3@{sampler.tag}"
        params = SamplingParams(n=N, temperature=1.0, max_new_tokens=4, seed=0)
        current["answer"] = lambda: answer(version=label)
        rollouts = sampler.generate([[1, 2, 3]], params)
        assert rollouts.completion_ids == [[5, 6, 7], [8, 9]] and rollouts.policy_version == 3
        current["answer"] = lambda: make(label)
        with pytest.raises(
            ServerError, match=f"^the vLLM server at {url} answered generation request 0 (with )?{named}"
        ):
            sampler.generate([[1, 2, 3]], params)
    finally:
        server.shutdown()
    assert issubclass(ServerError, MathRLError)
