"""Models and datasets named by Hugging Face Hub id (`Qwen/Qwen2.5-Math-1.5B`, `HuggingFaceH4/MATH-500`), found in
the local Hub cache, never downloaded.

A run reads only local files (no network at run time). A Hub id is resolved through `huggingface_hub`'s own cache
(`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`) with `local_files_only=True`, to the
snapshot directory of its `main` revision: fill the cache beforehand with `hf download <id>` (a dataset:
`hf download <id> --repo-type dataset`) on a machine with network. A local path is used as it is. A dataset's
snapshot is a dataset repository folder, which `data.sources.load_problems` reads with `datasets`.
"""

from __future__ import annotations

import os
import re

from mathrl_jax.errors import MathRLError

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HubModelError(MathRLError, ValueError):
    """A name that is neither a local path nor a model or dataset in the local Hub cache; says how to get it."""


def hub_cache_dir() -> str:
    """The Hub cache `huggingface_hub` uses, read from the environment now (not when it was imported)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def resolve_model_dir(name_or_path: str, what: str = "model_name_or_path") -> str:
    """`name_or_path` made absolute if it is a local directory ("" stays); else, for a Hub id, its snapshot in the
    local cache.

    Raises `HubModelError` naming `what`, the value and the cache looked in, for a name found in neither.
    """
    if name_or_path and os.path.isdir(name_or_path):  # absolute: a resumed run elsewhere names the same checkpoint
        return os.path.abspath(name_or_path)
    return _snapshot(name_or_path, what, "model", "is not a local directory")


def resolve_dataset_path(name_or_path: str, what: str = "dataset_path") -> str:
    """`name_or_path` made absolute if it is a local file or directory ("" stays); else, for a Hub id, the
    snapshot of that dataset repository in the local cache.

    Raises `HubModelError` naming `what`, the value and the cache looked in, for a name found in neither.
    """
    if name_or_path and os.path.exists(name_or_path):
        return os.path.abspath(name_or_path)
    return _snapshot(name_or_path, what, "dataset", "does not exist")


def _snapshot(name: str, what: str, repo_type: str, missing: str) -> str:
    if not name:
        return name
    cache = hub_cache_dir()
    if not _REPO_ID.match(name) or os.path.exists(name):
        raise HubModelError(f"{what} {name!r} {missing} (nor is it a Hub id: 'org/name')")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(name, repo_type=repo_type, cache_dir=cache, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError) as error:  # ValueError: a malformed id
        fetch = f"hf download {name}" + (" --repo-type dataset" if repo_type == "dataset" else "")
        local = "local directory" if repo_type == "model" else "local path"
        raise HubModelError(
            f"{what} {name!r} is neither a {local} nor in the local Hugging Face cache ({cache}): "
            f"nothing is downloaded at run time; fetch it first with `{fetch}` "
            f"(or give a {local}) [{type(error).__name__}]"
        ) from None
