"""`describe_server`'s refusals, each naming what the server lacks, before a run writes anything. The server here is
a stand-in that answers vLLM 0.32's routes with a real server's JSON (as `tests/sampling/test_vllm_modes.py`'s real
server gave it), one piece changed per case: a real server per case would cost ~20 s each, and the real server's
acceptance is tested there."""

import http.server
import json
import threading

import pytest

from mathrl_jax.sampling.vllm.server import ServerError, describe_server
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


def serve(answers, generate_status=200):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
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
                self.reply(generate_status, {"choices": []})
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
