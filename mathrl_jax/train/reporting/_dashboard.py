"""The dashboard's figures a TRL or verl user looks for, computed on the host from an iteration's graded batch:
the rewards' spread and the groups that teach nothing, the completions' lengths, the memory in use, and the
completion table (`log_completions`).

Each is a small pure function of host arrays; `_names.METRIC_NAMES` gives each name's meaning and its TRL / verl
counterpart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from mathrl_jax.sharding import distributed

GIB = float(1 << 30)

# The update's figures that are no measurement of its passes (`train.update`'s names): counts over the whole update,
# the optimizers' scheduled learning rates; and the critic's own (value_*), which trains on every row regardless.
UPDATE_COUNTS = ("minibatches_trained", "trained_token_fraction", "skipped_updates", "kl_skipped_fraction")
UPDATE_RATES = ("lr", "value_lr")


def measured_update_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The update's host `metrics` (`train.update.make_update_fn`'s names) without the policy's measurements when
    no minibatch trained a token (`minibatches_trained` 0: every row of zero advantage with skip_zero_advantage, or
    DAPO's filter keeping none): its loss, entropy, KL, ratios, clip fractions and gradient norm were measured over
    nothing, and are left out rather than logged as 0. The counts, the learning rates and the critic's `value_*`
    stay. An update that trained something, or that does not count (no `minibatches_trained`), comes back whole."""
    if int(np.asarray(metrics.get("minibatches_trained", 1))) > 0:
        return dict(metrics)
    return {k: v for k, v in metrics.items() if k in UPDATE_COUNTS + UPDATE_RATES or k.startswith("value_")}


def reward_metrics(rewards: np.ndarray, group_ids: np.ndarray, *, atol: float = 1e-8) -> dict[str, float]:
    """The spread of the rewards `[N]` of a batch's responses, in groups `group_ids [N]` (the responses of one
    prompt):

      rollout/rewards_std        std over the batch, sqrt(mean (r - mean r)^2) (verl's `critic/score` has no std)
      rollout/rewards_min, _max  verl `critic/score/min`, `critic/score/max`
      rollout/rewards_group_std  mean over the groups of the unbiased within-group std (TRL's `reward_std`:
                                 `rewards.view(-1, G).std(dim=1).mean()`)
      rollout/frac_reward_zero_std  fraction of the groups whose rewards have zero std, |std| <= atol
                                 (TRL's `frac_reward_zero_std`, `torch.isclose(std, 0)`): the groups whose
                                 group-relative advantages are all 0, which teach nothing

    The two group figures count the groups of at least two responses, and are absent when there is none (a
    multi-turn run's single episodes); an empty batch has no figure."""
    rewards = np.asarray(rewards, np.float64).reshape(-1)
    group_ids = np.asarray(group_ids).reshape(-1)
    if rewards.shape != group_ids.shape:
        raise ValueError(f"rewards {rewards.shape} and group_ids {group_ids.shape}: expected one id per reward")
    if rewards.size == 0:
        return {}
    metrics = {
        "rollout/rewards_std": float(np.std(rewards)),
        "rollout/rewards_min": float(np.min(rewards)),
        "rollout/rewards_max": float(np.max(rewards)),
    }
    stds = [np.std(rewards[group_ids == g], ddof=1) for g in np.unique(group_ids) if np.sum(group_ids == g) > 1]
    if stds:
        metrics["rollout/rewards_group_std"] = float(np.mean(stds))
        metrics["rollout/frac_reward_zero_std"] = float(np.mean(np.isclose(stds, 0.0, rtol=0.0, atol=atol)))
    return metrics


def length_metrics(lengths: np.ndarray, finish_reasons: Sequence[str]) -> dict[str, float]:
    """The completions' lengths `[N]` in tokens, with their finish reasons ("length": cut at max_new_tokens
    without an end of sequence):

      rollout/response_length        mean (TRL `completions/mean_length`, verl `response_length/mean`)
      rollout/response_length_min, _max  TRL `completions/{min,max}_length`, verl `response_length/{min,max}`
      rollout/truncated_fraction     fraction cut at max_new_tokens (TRL `completions/clipped_ratio`, verl
                                     `response_length/clip_ratio`)
      rollout/terminated_length      mean length of the others, which ended by themselves (TRL
                                     `completions/mean_terminated_length`; absent when every one was cut)"""
    lengths = np.asarray(lengths, np.float64).reshape(-1)
    cut = np.asarray(finish_reasons) == "length"
    if cut.shape != lengths.shape:
        raise ValueError(f"{lengths.size} lengths and {cut.size} finish reasons: expected one of each per completion")
    if lengths.size == 0:
        return {}
    metrics = {
        "rollout/response_length": float(lengths.mean()),
        "rollout/response_length_min": float(lengths.min()),
        "rollout/response_length_max": float(lengths.max()),
        "rollout/truncated_fraction": float(cut.mean()),
    }
    if (~cut).any():
        metrics["rollout/terminated_length"] = float(lengths[~cut].mean())
    return metrics


def device_memory_metrics(stats: Sequence[dict[str, Any] | None]) -> dict[str, float]:
    """`perf/device_memory_gb` / `perf/device_memory_peak_gb`: the most `bytes_in_use` / `peak_bytes_in_use` of
    one device among `stats` (each local device's `Device.memory_stats()`), in GiB (verl's
    `perf/max_memory_allocated_gb`). Absent where no device reports them (the CPU backend returns None)."""
    reported = [s for s in stats if s and "bytes_in_use" in s]
    if not reported:
        return {}
    metrics = {"perf/device_memory_gb": max(s["bytes_in_use"] for s in reported) / GIB}
    peaks = [s["peak_bytes_in_use"] for s in reported if "peak_bytes_in_use" in s]
    if peaks:
        metrics["perf/device_memory_peak_gb"] = max(peaks) / GIB
    return metrics


def host_memory_metrics(status_path: str = "/proc/self/status") -> dict[str, float]:
    """`perf/host_memory_gb` / `perf/host_memory_peak_gb`: this process's resident set now and at its peak (the
    kernel's VmRSS / VmHWM lines of /proc/self/status, in kB), in GiB (verl's `perf/cpu_memory_used_gb`).
    Absent where there is no such file (not Linux)."""
    try:
        with open(status_path, encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    fields = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM") and value.split():
            fields[key] = int(value.split()[0]) * 1024 / GIB  # "VmRSS:   123456 kB"
    names = {"VmRSS": "perf/host_memory_gb", "VmHWM": "perf/host_memory_peak_gb"}
    return {names[k]: v for k, v in fields.items()}


def memory_metrics() -> dict[str, float]:
    """The device memory where the backend reports it (`device_memory_metrics` over `jax.local_devices()`) and
    the host's (`host_memory_metrics`)."""
    return {**device_memory_metrics([d.memory_stats() for d in jax.local_devices()]), **host_memory_metrics()}


TABLE_COLUMNS = ("step", "prompt", "completion", "reward", "advantage", "length", "truncated")


def completion_rows(
    step: int,
    prompts: Sequence[str],
    completions: Sequence[str],
    rewards: np.ndarray,
    advantages: np.ndarray,
    lengths: np.ndarray,
    finish_reasons: Sequence[str],
    count: int,
) -> list[dict[str, Any]]:
    """The first `count` rows of a completion table (TRL's `log_completions`, `num_completions_to_print` rows):
    per response its prompt and completion text, reward, advantage (the mean of its tokens' advantages: the
    sequence's own for the group-relative estimators), length in tokens, whether it was cut at max_new_tokens,
    and the step."""
    n = min(int(count), len(completions))
    return [
        {
            "step": int(step),
            "prompt": str(prompts[i]),
            "completion": str(completions[i]),
            "reward": float(rewards[i]),
            "advantage": float(advantages[i]),
            "length": int(lengths[i]),
            "truncated": bool(finish_reasons[i] == "length"),
        }
        for i in range(n)
    ]


def _cell(value: Any) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] = TABLE_COLUMNS) -> str:
    """`rows` as a Markdown table (tensorboard's text summaries render Markdown): a header of `columns`, one line
    per row; a `|` in a cell escaped, a newline written as `<br>`."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def completion_table(
    step: int,
    decode,
    rollouts,
    rewards: np.ndarray,
    batch: Mapping[str, Any],
    rows: Sequence[int],
    count: int,
) -> list[dict[str, Any]]:
    """`completion_rows` of the batch's responses `rows` (indices; a multi-turn batch's real rows), texts from
    `decode(ids)` (the run's tokenizer), each response's advantage the mean of the update batch's
    `advantages [N, L]` over its tokens (its `response_mask [N, L]`: 0 for a row DAPO filtered out): what the loss
    weighs, so with `tis_cap` after the importance weights (`rollout/advantages_*` are before them). The two arrays
    are fetched from the devices (`distributed.fetch`: a collective, which every process calls)."""
    rows = [int(i) for i in rows][: int(count)]
    advantages, mask = distributed.fetch((batch["advantages"], batch["response_mask"]))
    mask = np.asarray(mask, np.float64)
    per_row = np.sum(np.asarray(advantages, np.float64) * mask, axis=1) / np.maximum(mask.sum(axis=1), 1.0)
    return completion_rows(
        step,
        [decode(rollouts.prompt_ids[i]) for i in rows],
        [decode(rollouts.completion_ids[i]) for i in rows],
        np.asarray(rewards)[rows],
        per_row[rows],
        np.asarray(rollouts.completion_lengths)[rows],
        [rollouts.finish_reasons[i] for i in rows],
        len(rows),
    )
