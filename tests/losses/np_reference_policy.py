"""Plain-NumPy (float64) reference implementations of the loss formulas.

Written from the formulas in the docstrings of `mathrl_jax.losses` and from the
papers / systems they cite (verl `compute_policy_loss`, AReaL
`ppo_actor_loss_fn`, GSPO, Schulman's KL estimators, PPO's clipped value loss).
Nothing here imports or calls the code under test; per-token work is written as
explicit loops over (b, t) so that every formula can be read off directly.
"""

from __future__ import annotations

import math

import numpy as np

MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
MEAN_EPS = 1e-8  # the `1e-8` of verl's masked_mean


def f64(x):
    return np.asarray(x, dtype=np.float64)


# --------------------------------------------------------------------------- masked reductions


def masked_sum(x, mask):
    x, mask = f64(x), f64(mask)
    total = 0.0
    for idx in np.ndindex(x.shape):
        if mask[idx] > 0:
            total += x[idx] * mask[idx]
    return total


def masked_mean(x, mask, eps=MEAN_EPS):
    """sum(m x) / (sum(m) + eps)."""
    return masked_sum(x, mask) / (float(f64(mask).sum()) + eps)


def masked_values(x, mask):
    x, mask = f64(x), f64(mask)
    return np.array([x[idx] for idx in np.ndindex(x.shape) if mask[idx] > 0])


# --------------------------------------------------------------------------- aggregation


def counted_rows(mask):
    mask = f64(mask)
    return [b for b in range(mask.shape[0]) if mask[b].sum() > 0]


def loss_denominator(mask, mode):
    """token-mean: number of counted tokens; seq-mean-*: number of non-empty rows (>= 1)."""
    mask = f64(mask)
    if mode == "token-mean":
        return max(float(mask.sum()), 1.0)
    return max(float(len(counted_rows(mask))), 1.0)


def loss_numerator(loss_mat, mask, mode, norm_constant=None):
    loss_mat, mask = f64(loss_mat), f64(mask)
    B, T = loss_mat.shape
    row_sums = [masked_sum(loss_mat[b], mask[b]) for b in range(B)]
    if mode in ("token-mean", "seq-mean-token-sum"):
        return float(sum(row_sums))
    if mode == "seq-mean-token-mean":
        return float(sum(row_sums[b] / mask[b].sum() for b in counted_rows(mask)))
    if mode == "seq-mean-token-sum-norm":
        constant = T if norm_constant is None else norm_constant
        return float(sum(row_sums)) / constant
    raise ValueError(mode)


def aggregate(loss_mat, mask, mode="token-mean", norm_constant=None, denominator=None):
    """The module table of `aggregate.py`, straight from the formulas:

    token-mean              sum_{b,t} m l / sum_{b,t} m
    seq-mean-token-mean     mean_b [ sum_t m l / sum_t m ]
    seq-mean-token-sum      mean_b [ sum_t m l ]
    seq-mean-token-sum-norm mean_b [ sum_t m l / C ]
    with mean_b over rows that have a counted token.
    """
    if denominator is None:
        denominator = loss_denominator(mask, mode)
    return loss_numerator(loss_mat, mask, mode, norm_constant) / float(denominator)


# --------------------------------------------------------------------------- policy losses


def _clip(x, lo, hi):
    return min(max(x, lo), hi)


def _surrogate(ratio, adv, clip_low, clip_high, clip_c):
    """Per-token PPO loss and indicator values for one token (scalars)."""
    unclipped = -adv * ratio
    clipped = -adv * _clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = max(unclipped, clipped)
    ind = {
        "clip_fraction": float(clipped > unclipped),
        "clip_fraction_high": float(ratio > 1.0 + clip_high and adv > 0),
        "clip_fraction_low": float(ratio < 1.0 - clip_low and adv < 0),
        "dual_clip_fraction": 0.0,
    }
    if clip_c is not None and adv < 0:
        bound = -adv * clip_c
        ind["dual_clip_fraction"] = float(loss > bound)
        loss = min(loss, bound)
    return loss, ind


def _ratio_metrics(log_ratio, ratio, mask):
    kept = masked_values(ratio, mask)
    return {
        "approx_kl": masked_mean(-f64(log_ratio), mask),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": float(kept.max()) if kept.size else 0.0,
    }


def ppo_clip(
    logprobs,
    old_logprobs,
    advantages,
    mask,
    clip_low=0.2,
    clip_high=None,
    clip_c=None,
    log_ratio_clamp=20.0,
    mode="token-mean",
    norm_constant=None,
    denominator=None,
):
    """r = exp(clamp(logp - old, +-c)); l = max(-A r, -A clip(r, 1-el, 1+eh)); dual: min(l, -A c) for A<0."""
    logprobs, old_logprobs, advantages, mask = map(f64, (logprobs, old_logprobs, advantages, mask))
    clip_high = clip_low if clip_high is None else clip_high
    B, T = logprobs.shape
    loss_mat = np.zeros((B, T))
    log_ratio = np.zeros((B, T))
    ratio = np.zeros((B, T))
    inds = {
        k: np.zeros((B, T)) for k in ("clip_fraction", "clip_fraction_high", "clip_fraction_low", "dual_clip_fraction")
    }
    for b in range(B):
        for t in range(T):
            lr = logprobs[b, t] - old_logprobs[b, t]
            if log_ratio_clamp is not None:
                lr = _clip(lr, -log_ratio_clamp, log_ratio_clamp)
            r = math.exp(lr)
            loss_mat[b, t], ind = _surrogate(r, advantages[b, t], clip_low, clip_high, clip_c)
            log_ratio[b, t], ratio[b, t] = lr, r
            for k, v in ind.items():
                inds[k][b, t] = v
    loss = aggregate(loss_mat, mask, mode, norm_constant, denominator)
    metrics = {k: masked_mean(v, mask) for k, v in inds.items()}
    metrics.update(_ratio_metrics(log_ratio, ratio, mask))
    metrics["policy_loss"] = loss
    return loss, metrics


def decoupled_ppo(
    logprobs,
    old_logprobs,
    advantages,
    mask,
    proximal_logprobs,
    clip_low=0.2,
    clip_high=None,
    clip_c=None,
    behaviour_weight_cap=None,
    log_ratio_clamp=20.0,
    mode="token-mean",
    norm_constant=None,
    denominator=None,
):
    """AReaL eq. 5: l = w * max(-A r, -A clip(r)) with r = pi / pi_prox, w = pi_prox / pi_behav.

    Tokens with w > cap get w = 0 but stay in the denominator. Behaviour metrics
    are means over the counted tokens that were kept (AReaL's `behav_mask`);
    the capped fraction is a mean over all counted tokens.
    """
    logprobs, old_logprobs, advantages, mask, proximal_logprobs = map(
        f64, (logprobs, old_logprobs, advantages, mask, proximal_logprobs)
    )
    clip_high = clip_low if clip_high is None else clip_high
    B, T = logprobs.shape
    loss_mat = np.zeros((B, T))
    log_ratio = np.zeros((B, T))
    ratio = np.zeros((B, T))
    weight = np.zeros((B, T))
    log_weight = np.zeros((B, T))
    kept = np.zeros((B, T))
    inds = {
        k: np.zeros((B, T)) for k in ("clip_fraction", "clip_fraction_high", "clip_fraction_low", "dual_clip_fraction")
    }
    for b in range(B):
        for t in range(T):
            lr = _clip(logprobs[b, t] - proximal_logprobs[b, t], -log_ratio_clamp, log_ratio_clamp)
            r = math.exp(lr)
            per_token, ind = _surrogate(r, advantages[b, t], clip_low, clip_high, clip_c)
            lw = _clip(proximal_logprobs[b, t] - old_logprobs[b, t], -log_ratio_clamp, log_ratio_clamp)
            w = math.exp(lw)
            keep = behaviour_weight_cap is None or w <= behaviour_weight_cap
            w = w if keep else 0.0
            loss_mat[b, t] = w * per_token
            log_ratio[b, t], ratio[b, t] = lr, r
            weight[b, t], log_weight[b, t], kept[b, t] = w, lw, float(keep)
            for k, v in ind.items():
                inds[k][b, t] = v
    loss = aggregate(loss_mat, mask, mode, norm_constant, denominator)
    metrics = {k: masked_mean(v, mask) for k, v in inds.items()}
    metrics.update(_ratio_metrics(log_ratio, ratio, mask))
    kept_mask = mask * kept
    metrics["behaviour_weight_mean"] = masked_mean(weight, kept_mask)
    metrics["behaviour_kl"] = masked_mean(log_weight, kept_mask)
    metrics["behaviour_capped_fraction"] = masked_mean(1.0 - kept, mask)
    metrics["policy_loss"] = loss
    return loss, metrics


def gspo_sequence_log_ratios(logprobs, old_logprobs, mask):
    """log s_i = (1/|y_i|) sum_t m_t (logp - old)   (|y_i| clamped to >= 1)."""
    logprobs, old_logprobs, mask = map(f64, (logprobs, old_logprobs, mask))
    B, T = logprobs.shape
    out = np.zeros(B)
    for b in range(B):
        total, length = 0.0, 0.0
        for t in range(T):
            if mask[b, t] > 0:
                total += mask[b, t] * (logprobs[b, t] - old_logprobs[b, t])
                length += mask[b, t]
        out[b] = total / max(length, 1.0)
    return out


def gspo(
    logprobs,
    old_logprobs,
    advantages,
    mask,
    clip_low=3e-4,
    clip_high=4e-4,
    log_ratio_max=10.0,
    mode="seq-mean-token-mean",
    norm_constant=None,
    denominator=None,
):
    """GSPO: every token of sequence i carries s_i = exp(min(log s_i, max)); PPO clip on it."""
    logprobs, old_logprobs, advantages, mask = map(f64, (logprobs, old_logprobs, advantages, mask))
    B, T = logprobs.shape
    seq_lr = gspo_sequence_log_ratios(logprobs, old_logprobs, mask)
    loss_mat = np.zeros((B, T))
    ratio = np.zeros((B, T))
    token_log_ratio = np.zeros((B, T))
    inds = {
        k: np.zeros((B, T)) for k in ("clip_fraction", "clip_fraction_high", "clip_fraction_low", "dual_clip_fraction")
    }
    for b in range(B):
        s = math.exp(min(seq_lr[b], log_ratio_max))
        for t in range(T):
            loss_mat[b, t], ind = _surrogate(s, advantages[b, t], clip_low, clip_high, None)
            ratio[b, t] = s
            token_log_ratio[b, t] = logprobs[b, t] - old_logprobs[b, t] if mask[b, t] > 0 else 0.0
            for k, v in ind.items():
                inds[k][b, t] = v
    loss = aggregate(loss_mat, mask, mode, norm_constant, denominator)
    metrics = {k: masked_mean(v, mask) for k, v in inds.items()}
    metrics.update(_ratio_metrics(token_log_ratio, ratio, mask))
    metrics["policy_loss"] = loss
    return loss, metrics


def gspo_grad_unclipped(logprobs, old_logprobs, advantages, mask):
    """d loss / d logp_{i,t} for seq-mean-token-mean when no sequence is clipped:
    -A_i s_i m_{i,t} / (|y_i| N), N = number of non-empty sequences."""
    logprobs, old_logprobs, advantages, mask = map(f64, (logprobs, old_logprobs, advantages, mask))
    B, T = logprobs.shape
    seq_lr = gspo_sequence_log_ratios(logprobs, old_logprobs, mask)
    n_seq = loss_denominator(mask, "seq-mean-token-mean")
    grad = np.zeros((B, T))
    for b in range(B):
        length = mask[b].sum()
        for t in range(T):
            if mask[b, t] > 0:
                grad[b, t] = -advantages[b, t] * math.exp(seq_lr[b]) * mask[b, t] / (length * n_seq)
    return grad


def reinforce(logprobs, old_logprobs, advantages, mask, mode="token-mean", norm_constant=None, denominator=None):
    """l = -A logp; metrics from the clamped ratio against old_logprobs; clip metrics 0."""
    logprobs, old_logprobs, advantages, mask = map(f64, (logprobs, old_logprobs, advantages, mask))
    loss = aggregate(-advantages * logprobs, mask, mode, norm_constant, denominator)
    log_ratio = np.clip(logprobs - old_logprobs, -20.0, 20.0)
    metrics = _ratio_metrics(log_ratio, np.exp(log_ratio), mask)
    metrics.update(clip_fraction=0.0, clip_fraction_high=0.0, clip_fraction_low=0.0, dual_clip_fraction=0.0)
    metrics["policy_loss"] = loss
    return loss, metrics


def central_difference(fn, x, h=1e-6):
    """Numerical gradient of a scalar float64 function of an array."""
    x = f64(x).copy()
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        orig = x[idx]
        x[idx] = orig + h
        plus = fn(x)
        x[idx] = orig - h
        minus = fn(x)
        x[idx] = orig
        grad[idx] = (plus - minus) / (2 * h)
    return grad


# --------------------------------------------------------------------------- KL estimators


def kl_k1(d):
    return f64(d)


def kl_abs(d):
    return np.abs(f64(d))


def kl_k2(d):
    return 0.5 * f64(d) ** 2


def kl_k3(d, log_ratio_clamp=20.0, value_clamp=10.0):
    """exp(-d) + d - 1 with -d clamped to [-20, 20] and the result to [-10, 10]."""
    d = f64(d)
    out = np.zeros_like(d)
    for idx in np.ndindex(d.shape):
        x = _clip(-d[idx], -log_ratio_clamp, log_ratio_clamp)
        out[idx] = _clip(math.exp(x) - x - 1.0, -value_clamp, value_clamp)
    return out


KL_BY_KIND = {"k1": kl_k1, "kl": kl_k1, "abs": kl_abs, "k2": kl_k2, "mse": kl_k2, "k3": kl_k3, "low_var_kl": kl_k3}


def kl_per_token(logprobs, ref_logprobs, kind):
    return KL_BY_KIND[kind](f64(logprobs) - f64(ref_logprobs))


# --------------------------------------------------------------------------- value losses


def huber(e, delta):
    """Huber(e) = e^2/2 if |e| <= delta else delta (|e| - delta/2)."""
    e = f64(e)
    out = np.zeros_like(e)
    for idx in np.ndindex(e.shape):
        a = abs(e[idx])
        out[idx] = 0.5 * e[idx] ** 2 if a <= delta else delta * (a - 0.5 * delta)
    return out


def huber_grad(e, delta):
    e = f64(e)
    return np.where(np.abs(e) <= delta, e, delta * np.sign(e))


def explained_variance(values, returns, mask):
    """1 - Var[R - V] / Var[R] over the masked entries (biased variances, + 1e-8); 0 with no masked entry."""
    if not np.any(np.asarray(mask) > 0):
        return 0.0
    r = masked_values(returns, mask)
    v = masked_values(values, mask)
    return 1.0 - np.var(r - v) / (np.var(r) + 1e-8)


def clipped_value(
    values,
    old_values,
    returns,
    mask,
    clip_range=0.2,
    loss_type="mse",
    huber_delta=10.0,
    mode="token-mean",
    norm_constant=None,
):
    """Returns (loss, metrics, grad wrt values).

    V_clip = V_old + clip(V - V_old, -eps, eps); l = max(f(R - V), f(R - V_clip)).
    The gradient is f'-based on tokens where the unclipped term is (weakly) the
    max, and zero where the clipped term is strictly larger.
    """
    values, old_values, returns, mask = map(f64, (values, old_values, returns, mask))
    B, T = values.shape

    def f(e):
        return 0.5 * e * e if loss_type == "mse" else float(huber(np.array(e), huber_delta))

    def fprime(e):
        return e if loss_type == "mse" else float(huber_grad(np.array(e), huber_delta))

    loss_mat = np.zeros((B, T))
    clipped_larger = np.zeros((B, T))
    dloss_dv = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            err = returns[b, t] - values[b, t]
            unclipped = f(err)
            if clip_range is None:
                loss_mat[b, t] = unclipped
                dloss_dv[b, t] = -fprime(err)
                continue
            # V_old + clip(V - V_old, -eps, eps), written as a clip of V itself so that
            # V_clip == V exactly when the clip is inactive.
            v_clip = _clip(values[b, t], old_values[b, t] - clip_range, old_values[b, t] + clip_range)
            clipped = f(returns[b, t] - v_clip)
            loss_mat[b, t] = max(unclipped, clipped)
            clipped_larger[b, t] = float(clipped > unclipped)
            dloss_dv[b, t] = 0.0 if clipped > unclipped else -fprime(err)
    loss = aggregate(loss_mat, mask, mode, norm_constant)
    denominator = loss_denominator(mask, mode)
    scale = 1.0
    if mode == "seq-mean-token-sum-norm":
        scale = 1.0 / (T if norm_constant is None else norm_constant)
    grad = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            if mask[b, t] > 0:
                per_row = mask[b].sum() if mode == "seq-mean-token-mean" else 1.0
                grad[b, t] = dloss_dv[b, t] * mask[b, t] * scale / (per_row * denominator)
    metrics = {
        "value_loss": loss,
        "value_clip_fraction": 0.0 if clip_range is None else masked_mean(clipped_larger, mask),
        "value_mean": masked_mean(values, mask),
        "explained_variance": explained_variance(values, returns, mask),
    }
    return loss, metrics, grad, clipped_larger


# --------------------------------------------------------------------------- guards


def mean_importance_ratio(logprobs, old_logprobs, mask, log_ratio_clamp=20.0):
    lr = np.clip(f64(logprobs) - f64(old_logprobs), -log_ratio_clamp, log_ratio_clamp)
    return masked_mean(np.exp(lr), mask)


def mean_k3_new_over_old(logprobs, old_logprobs, mask):
    """mean_t [(r - 1) - log r], r = pi / pi_old."""
    log_r = f64(logprobs) - f64(old_logprobs)
    return masked_mean(np.expm1(log_r) - log_r, mask)
