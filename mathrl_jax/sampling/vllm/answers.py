"""A vLLM server's answers, read and checked: nothing it sends is trusted (issue 60).

A rollout is built only from an answer whose every field was checked (`completions`), and a body that is not the
JSON asked for (`{}`, an HTML page from a proxy or another program on the port) is a `ServerError` naming the
server and the request, never a `KeyError` or a skipped update. Used by `server.py` (the trainer's client).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np

from mathrl_jax.errors import MathRLError
from mathrl_jax.sampling.vllm.requests import Completion


class ServerError(MathRLError, RuntimeError):
    """The vLLM server is unreachable, refuses a request, or was started without what the sampler needs."""


LOGPROB_TOLERANCE = 1e-4
"""How far above 0 a sampled token's log-prob may be (the engine's float32 log-softmax rounds); more is a server's
bug, refused, not trained on."""


def completions(answer: Any, request: Dict[str, Any], vocab_size: int, what: str) -> List[Completion]:
    """A generate route's answer to one request as its samples, every field checked: `n` choices indexed 0..n-1,
    token ids (ints in `[0, vocab_size)`, at most `max_tokens`), one finite log-prob <= 0 a token, weight-version
    stamps. Anything else raises `ServerError` (`what` names the server and the request): a rollout is never built
    from an answer the sampler cannot vouch for."""

    def bad(why: str):
        return ServerError(f"{what} with {why}")

    choices = field(answer, ("choices",), list, what)
    n = int(request["n"])
    indices = [c.get("index") if isinstance(c, dict) else None for c in choices]
    if not all(type(i) is int for i in indices) or sorted(indices) != list(range(n)):
        raise bad(f"choices indexed {indices[:8]}, expected {n} indexed 0..{n - 1}")
    out = []
    for choice in sorted(choices, key=lambda c: c["index"]):
        which = f"choice {choice['index']}"
        token_ids = field(choice, ("token_ids",), list, what)
        if not all(type(t) is int for t in token_ids):
            raise bad(f"{which}'s token ids not all integers: {[t for t in token_ids if type(t) is not int][:5]}")
        outside = [t for t in token_ids if not 0 <= t < vocab_size]
        if outside:
            raise bad(f"{which}'s token ids outside the vocabulary [0, {vocab_size}): {outside[:5]}")
        if len(token_ids) > int(request["max_tokens"]):
            raise bad(f"{which} of {len(token_ids)} tokens, more than the {request['max_tokens']} asked for")
        content = field(choice.get("logprobs"), ("content",), list, f"{what} ({which})") if token_ids else []
        values = [step.get("logprob") if isinstance(step, dict) else None for step in content]
        if not all(type(v) in (int, float) for v in values):
            raise bad(f"{which}'s log-probs not all numbers: {[v for v in values if type(v) not in (int, float)][:5]}")
        if len(values) != len(token_ids):
            raise bad(f"{which}'s {len(values)} log-probs for {len(token_ids)} tokens (one a token expected)")
        # An integer past a float (`1` and 400 zeros) becomes inf here rather than an OverflowError.
        lp = np.array([float(v) if type(v) is float or abs(v) < 2**1000 else np.inf for v in values], np.float64)
        wrong = lp[~(np.isfinite(lp) & (lp <= LOGPROB_TOLERANCE))]
        if wrong.size:
            raise bad(f"{which}'s log-probs not finite and <= 0: {wrong[:5].tolist()}")
        finish_reason = choice.get("finish_reason")
        stop_reason = choice.get("stop_reason")
        spans = choice.get("weight_versions") or []
        if not isinstance(finish_reason, (str, type(None))) or not isinstance(stop_reason, (int, str, type(None))):
            raise bad(f"{which}'s finish reason {finish_reason!r} / stop reason {stop_reason!r}")
        stamped = isinstance(spans, list) and all(
            isinstance(s, dict) and isinstance(s.get("version"), str) for s in spans
        )
        if not stamped:
            raise bad(f"{which}'s weight-version stamps of {shape(spans)}, expected a list of {{'version': text}}")
        out.append(
            Completion(
                token_ids=list(token_ids),
                logprobs=lp.astype(np.float32),
                finish_reason=finish_reason or "abort",
                stop_reason=stop_reason,
                versions=[span["version"] for span in spans],
            )
        )
    return out


def json_body(response, what: str) -> Any:
    """The response's JSON body; `ServerError` (`what` with the body's start) if it is not JSON (an HTML page: a
    proxy, another program on the port)."""
    try:
        return response.json()
    except ValueError:
        text = " ".join(response.text[:200].split())
        raise ServerError(f"{what} with something other than JSON: {text!r}") from None


def field(answer: Any, keys: Sequence[str], kind: type, what: str) -> Any:
    """`answer[k0][k1]...`, required to be a `kind` (an int: not a bool); `ServerError` naming the missing or
    mistyped field otherwise (a server answering `{}`, or another program's JSON)."""
    value = answer
    for depth, key in enumerate(keys):
        if not isinstance(value, dict) or key not in value:
            where = ".".join(keys[:depth]) or "the answer"
            raise ServerError(f"{what} without {'.'.join(keys[: depth + 1])!r} ({where} is {shape(value)})")
        value = value[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ServerError(f"{what} with {'.'.join(keys)!r} of {shape(value)}, expected {kind.__name__}")
    return value


def shape(value: Any) -> str:
    """A short description of a JSON value, for an error (never the whole of it)."""
    if isinstance(value, dict):
        return f"an object with keys {sorted(value)[:6]}" if value else "an empty object"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return f"{type(value).__name__} {str(value)[:40]!r}"


def check_status(response, what: str) -> None:
    if response.status_code >= 400:
        raise ServerError(f"{what}: HTTP {response.status_code}: {' '.join(response.text[:300].split())}")


def response_text(error) -> str:
    response = getattr(error, "response", None)
    if response is not None:
        return f"HTTP {response.status_code}: {response.text[:300]}"
    return short(error)


def short(error: BaseException) -> str:
    """The last line of an exception's text (requests nests the socket error in several layers)."""
    text = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    return text[:300]
