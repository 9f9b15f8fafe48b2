"""Models and datasets named by local path or by Hugging Face Hub id (`Qwen/Qwen2.5-Math-1.5B`,
`HuggingFaceH4/MATH-500`): a local path is used as it is; a Hub id is downloaded into the local Hub cache when the
environment allows it, else read from that cache.

A name is a *local path* when it exists, or when its shape says so even though it does not exist: it starts with
`/`, `./`, `../` or `~`, holds more than one `/`, ends in a data or checkpoint file extension (`.jsonl`,
`.parquet`, `.safetensors`, ...), or its first component is an existing local directory (`my_data/nope`, with
`my_data/` here). A missing local path is refused with the absolute path looked at: it is never taken for a Hub id
(so a typo is not answered with a download attempt). Any other `org/name` is a *Hub id*:

- online (`HF_HUB_OFFLINE` unset or false, read when the name is resolved): `huggingface_hub.snapshot_download`
  fetches the repository's `main` revision from `$HF_ENDPOINT` (default https://huggingface.co) into the cache,
  one stderr line saying what, from where and into which cache; files already cached are not fetched again. For a
  model only the files a run reads are fetched (`MODEL_FILES`: config, safetensors weights, tokenizer files,
  generation config), not other formats' weights.
- offline (`HF_HUB_OFFLINE=1`): the cached snapshot (`local_files_only=True`); fill the cache beforehand with
  `hf download <id>` (a dataset: `hf download <id> --repo-type dataset`) on a machine with network.

The cache is `huggingface_hub`'s own: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`,
else `~/.cache/huggingface/hub`. A name that resolves to nothing raises `HubModelError` (a `MathRLError`: one line,
exit 2 in the scripts) naming the option, the value and, for a Hub id, the endpoint, the cache and how to proceed.
A dataset's snapshot is a dataset repository folder, which `data.sources.load_problems` reads with `datasets`.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Optional, Tuple

from mathrl_jax.errors import MathRLError

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

PATH_EXTENSIONS = (
    ".jsonl",
    ".json",
    ".parquet",
    ".arrow",
    ".csv",
    ".tsv",
    ".txt",
    ".gz",
    ".zip",
    ".tar",
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".gguf",
    ".msgpack",
    ".npz",
)
"""File extensions of data and checkpoints: a name ending in one is a local path, never a Hub id."""

MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)
"""What a run reads of a model repository (`allow_patterns` of its download, and of the cache look-up offline)."""

_TRUE = {"1", "ON", "YES", "TRUE"}


class HubModelError(MathRLError, ValueError):
    """A name that is neither an existing local path nor a Hub id that could be had; says how to get it."""


def hub_cache_dir() -> str:
    """The Hub cache `huggingface_hub` uses, read from the environment now (not when it was imported)."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        home = os.environ.get("HF_HOME") or os.path.join(cache_home, "huggingface")
        cache = os.path.join(home, "hub")
    return os.path.expandvars(os.path.expanduser(cache))


def hub_offline() -> bool:
    """Whether Hub downloads are off: `HF_HUB_OFFLINE` (else `TRANSFORMERS_OFFLINE`) as set now, true for
    1/ON/YES/TRUE (`huggingface_hub.constants`' rule); when neither is set, `huggingface_hub.constants.HF_HUB_OFFLINE`.
    """
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    if value is not None:
        return value.upper() in _TRUE
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_endpoint() -> str:
    """The Hub a download asks: `$HF_ENDPOINT` as set now, else `huggingface_hub.constants.ENDPOINT`."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def local_path_reason(name: str) -> Optional[str]:
    """Why `name`, a path that does not exist, names a local path rather than a Hub id ('org/name'); None when it
    could be a Hub id. The rules are the module docstring's."""
    if name.startswith(("/", "./", "../", "~")) or name in (".", ".."):
        return "an absolute or relative path"
    if name.count("/") > 1:
        return "more than one '/'"
    if name.lower().endswith(PATH_EXTENSIONS):
        return f"a file name ({os.path.splitext(name)[1]})"
    first = name.split("/", 1)[0]
    if "/" in name and os.path.isdir(first):
        return f"{first}/ is a local directory"
    return None


def resolve_model_dir(name_or_path: str, what: str = "model_name_or_path") -> str:
    """`name_or_path` made absolute if it is a local directory ("" stays); else, for a Hub id, its snapshot in the
    local cache, downloaded first when online (`MODEL_FILES` only).

    Raises `HubModelError` naming `what` and the value: a missing local path with the absolute path looked at; a
    Hub id that could not be had with the endpoint, the cache and how to proceed.
    """
    if not name_or_path:
        return name_or_path
    path = os.path.abspath(os.path.expanduser(name_or_path))
    if os.path.isdir(path):  # absolute: a resumed run elsewhere names the same checkpoint
        return path
    if os.path.exists(path):
        raise HubModelError(f"{what} {name_or_path!r} is not a local directory: {path} is a file")
    return _resolve_id(name_or_path, path, what, "model", MODEL_FILES)


def resolve_dataset_path(name_or_path: str, what: str = "dataset_path") -> str:
    """`name_or_path` made absolute if it is a local file or directory ("" stays); else, for a Hub id, the
    snapshot of that dataset repository in the local cache, downloaded first when online.

    Raises `HubModelError` as `resolve_model_dir` does.
    """
    if not name_or_path:
        return name_or_path
    path = os.path.abspath(os.path.expanduser(name_or_path))
    if os.path.exists(path):
        return path
    return _resolve_id(name_or_path, path, what, "dataset", None)


def _resolve_id(name: str, path: str, what: str, repo_type: str, patterns) -> str:
    """`name`, which is no local path: refused if it reads as one; else the Hub id's snapshot (module docstring)."""
    local = "local directory" if repo_type == "model" else "local path"
    reason = local_path_reason(name)
    if reason is not None:
        raise HubModelError(
            f"{what} {name!r} is not a {local}: {path} does not exist (read as a local path, not a Hub id: {reason})"
        )
    if not _REPO_ID.match(name):
        raise HubModelError(f"{what} {name!r} is not a {local}: {path} does not exist; nor is it a Hub id ('org/name')")
    from huggingface_hub import snapshot_download

    cache, fetch = hub_cache_dir(), f"hf download {name}" + (" --repo-type dataset" if repo_type == "dataset" else "")
    if hub_offline():
        try:
            return snapshot_download(
                name, repo_type=repo_type, cache_dir=cache, local_files_only=True, allow_patterns=patterns
            )
        except Exception as error:  # LocalEntryNotFoundError (not cached), IncompleteSnapshotError, ...
            raise HubModelError(
                f"{what} {name!r} is neither a {local} nor in the local Hugging Face cache ({cache}) and "
                f"HF_HUB_OFFLINE is set, so nothing is downloaded: fetch it first with `{fetch}` on a machine with "
                f"network (or unset HF_HUB_OFFLINE, or give a {local}) [{type(error).__name__}]"
            ) from None
    endpoint = hub_endpoint()
    print(f"{what}: {repo_type} {name} from {endpoint} into the cache {cache}", file=sys.stderr, flush=True)
    try:
        return snapshot_download(name, repo_type=repo_type, cache_dir=cache, endpoint=endpoint, allow_patterns=patterns)
    except Exception as error:  # no connection, no such repository, a gated one, a server's error, ...
        why, hint = _download_problem(error, name, repo_type)
        raise HubModelError(
            f"{what} {name!r} is neither a {local} nor a {repo_type} that could be downloaded from {endpoint} "
            f"({why}) and it is not in the local Hugging Face cache ({cache}): {hint}; without network, fetch it "
            f"with `{fetch}` on a machine with network and run with HF_HUB_OFFLINE=1 (or give a {local})"
        ) from None


def _download_problem(error: Exception, name: str, repo_type: str) -> Tuple[str, str]:
    """One line of why a download failed, and what to check."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(error, GatedRepoError):
        return "a gated repository", "accept its terms on the Hub and log in with `hf auth login`"
    if isinstance(error, RepositoryNotFoundError):
        return f"no {repo_type} repository {name}", "check the id (a private one needs `hf auth login`)"
    if isinstance(error, RevisionNotFoundError):
        return "no 'main' revision", "check the id"
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        return f"HTTP {error.response.status_code}", "check the endpoint and try again"
    cause = error.__cause__ or error.__context__
    if cause is not None:  # LocalEntryNotFoundError from a connection error: the cause says which
        return f"{type(error).__name__} after {type(cause).__name__}", "check the network and HF_ENDPOINT"
    first_line = (str(error).strip().splitlines() or [""])[0][:160]
    return f"{type(error).__name__}: {first_line}".rstrip(": "), "check the network and HF_ENDPOINT"
