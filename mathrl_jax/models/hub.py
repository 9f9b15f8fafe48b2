"""Models named by Hugging Face Hub id (`Qwen/Qwen2.5-Math-1.5B`), found in the local Hub cache, never downloaded.

A run reads only local files (no network at run time). A Hub id is resolved through `huggingface_hub`'s own cache
(`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`) with `local_files_only=True`, to the
snapshot directory of its `main` revision: fill the cache beforehand with `hf download <id>` (or
`huggingface-cli download <id>`) on a machine with network. A local directory is used as it is.
"""

from __future__ import annotations

import os
import re

from mathrl_jax.errors import MathRLError

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HubModelError(MathRLError, ValueError):
    """A name that is neither a local directory nor a model in the local Hub cache; says how to get it."""


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
    if not name_or_path:
        return name_or_path
    if os.path.isdir(name_or_path):  # absolute: a resumed run from another directory names the same checkpoint
        return os.path.abspath(name_or_path)
    cache = hub_cache_dir()
    if not _REPO_ID.match(name_or_path) or os.path.exists(name_or_path):
        raise HubModelError(f"{what} {name_or_path!r} is not a local directory (nor a Hub id: 'org/name')")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(name_or_path, cache_dir=cache, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, OSError) as error:
        raise HubModelError(
            f"{what} {name_or_path!r} is neither a local directory nor in the local Hugging Face cache ({cache}): "
            f"nothing is downloaded at run time; fetch it first with `hf download {name_or_path}` "
            f"(or give a local checkpoint directory) [{type(error).__name__}]"
        ) from None
