"""APPO and TPPO as OpenR trains them: one update of the library, with the OpenR recipe's loss settings, against
a re-implementation of OpenR's `batch_process_appo` / `batch_process_tppo` + `ppo_update` written here from its
formulas (openreasoner/openr 54ae004, train/mat/utils/language_buffer.py, train/mat/trainers/llm_trainer_*.py,
train/mat/utils/util.py): per-action ratio, the approx-KL skip, per-minibatch whitening, one-sided Huber.

The reference uses only the models' forward passes and `jax.grad`; every formula of the RL side is its own. The
optimizer is plain SGD without a clip, so the parameter change is the gradient itself (Adam's first step,
lr * sign(g), or a norm clip would hide the loss's scale: e.g. a biased against an unbiased std).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from mathrl_jax import losses
from mathrl_jax.configs import openr_appo, openr_tppo
from mathrl_jax.errors import TrainingError
from mathrl_jax.models import QwenCritic, QwenForCausalLM, codec, tiny_config
from mathrl_jax.train.batch import _advantages as advantages_lib
from mathrl_jax.train.rollouts import _problems as problems
from mathrl_jax.train.setup import _sections as sections
from mathrl_jax.train.setup import _validation as validation
from mathrl_jax.train.state import create_train_state
from mathrl_jax.train.update._minibatches import minibatch_order
from mathrl_jax.train.update._passes import critic_values, policy_logprobs
from mathrl_jax.train.update._step import make_update_fn

CONFIG = tiny_config(num_hidden_layers=1)
N, P, T = 8, 4, 12  # answers, prompt tokens, answer tokens
ROWS_OFF_POLICY = 2
LR = 0.01  # rows of the first minibatch whose old log-probs are far off: that minibatch is skipped


@functools.lru_cache(maxsize=None)
def models():
    policy_graphdef, policy = nnx.split(QwenForCausalLM(CONFIG, rngs=nnx.Rngs(0)))
    critic = QwenCritic(CONFIG, rngs=nnx.Rngs(1))
    critic.score.kernel[...] = jax.random.normal(jax.random.key(2), critic.score.kernel[...].shape) * 0.5
    critic_graphdef, critic_params = nnx.split(critic)
    return policy_graphdef, policy, critic_graphdef, critic_params


def episodes(seed=0):
    """Random answers with random step boundaries; PRM scores per step; `[N, P + T]` in the trainer's layout."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, CONFIG.vocab_size, (N, P + T)).astype(np.int32)
    lengths = rng.integers(5, T + 1, N)
    attention = np.zeros((N, P + T), np.int32)
    response = np.zeros((N, P + T), np.float32)
    index = np.zeros((N, P + T), np.int32)
    for row, length in enumerate(lengths):
        attention[row, : P + length] = 1
        response[row, P : P + length] = 1
        ends = np.sort(rng.choice(np.arange(1, length), rng.integers(1, 4), replace=False))  # 2..4 steps
        index[row, P : P + length] = np.searchsorted(ends, np.arange(length), side="right")
    steps = index.max(axis=1) + 1
    step_rewards = np.zeros((N, 8), np.float32)
    for row in range(N):
        step_rewards[row, : steps[row]] = rng.uniform(-1, 1, steps[row])
    return ids, attention, response, index, step_rewards


def recipe(name):
    config = (openr_appo if name == "appo" else openr_tppo).get_config()
    return config


# ----------------------------------------------------------------------------- OpenR, re-implemented


def openr_huber(e, d):  # util.huber_loss: one-sided
    a = (jnp.abs(e) <= d).astype(jnp.float32)
    b = (e > d).astype(jnp.float32)
    return a * e**2 / 2 + b * d * (jnp.abs(e) - d / 2)


def openr_value_loss(values, old_values, returns, clip, delta, weights):
    clipped = old_values + jnp.clip(values - old_values, -clip, clip)
    loss = jnp.maximum(openr_huber(returns - clipped, delta), openr_huber(returns - values, delta))
    return jnp.sum(loss * weights) / jnp.sum(weights)


def appo_gae(step_rewards, step_values, steps, gamma, lam):
    """batch_process_appo over one episode per row: V(s_k), r_k, terminal after the last step (mask 0)."""
    advantages = np.zeros_like(step_values)
    for row in range(step_values.shape[0]):
        gae = 0.0
        for k in reversed(range(steps[row])):
            last = k == steps[row] - 1
            mask_next = 0.0 if last else 1.0
            v_next = 0.0 if last else step_values[row, k + 1]
            delta = step_rewards[row, k] + gamma * v_next * mask_next - step_values[row, k]
            gae = delta + gamma * lam * mask_next * gae
            advantages[row, k] = gae
    return advantages, advantages + step_values


def tppo_gae(step_rewards, token_values, index, response, gamma, lam):
    """batch_process_tppo: lambda inside a step; reward, gamma and gamma * lambda at its last token."""
    advantages = np.zeros_like(token_values)
    for row in range(token_values.shape[0]):
        columns = np.flatnonzero(response[row])
        gae = 0.0
        for j in reversed(range(len(columns))):
            c = columns[j]
            step = index[row, c]
            last_of_step = j == len(columns) - 1 or index[row, columns[j + 1]] != step
            if last_of_step:
                final = j == len(columns) - 1
                mask_next = 0.0 if final else 1.0
                v_next = 0.0 if final else token_values[row, columns[j + 1]]
                delta = step_rewards[row, step] + gamma * v_next * mask_next - token_values[row, c]
                gae = delta + gamma * lam * mask_next * gae
            else:
                delta = token_values[row, columns[j + 1]] - token_values[row, c]
                gae = delta + lam * gae
            advantages[row, c] = gae
    return advantages, advantages + token_values


def openr_update(algorithm, config, order, ids, attention, response, index, step_rewards, old_logprobs):
    """OpenR's ppo_update, minibatch by minibatch in `order`: critic step, then the policy step unless its
    approx-KL is over target_kl. Returns (policy params, critic params, policy steps applied)."""
    policy_graphdef, policy, critic_graphdef, critic_params = models()
    optimizer = optax.sgd(LR)
    policy_opt, critic_opt = optimizer.init(policy), optimizer.init(critic_params)
    first = np.zeros_like(response)  # each step's first token: the state it is taken from
    steps = index.max(axis=1) + 1
    for row in range(N):
        columns = np.flatnonzero(response[row])
        first[row, columns[np.r_[True, np.diff(index[row, columns]) != 0]]] = 1
    token_values = np.asarray(critic_values(critic_graphdef, critic_params, ids, attention)) * response
    if algorithm == "appo":
        step_values = np.zeros((N, 8), np.float32)
        for row in range(N):
            step_values[row, : steps[row]] = token_values[row][first[row] > 0]
        step_adv, step_ret = appo_gae(step_rewards, step_values, steps, config.gamma, config.lam)
    else:
        token_adv, token_ret = tppo_gae(step_rewards, token_values, index, response, config.gamma, config.lam)
    applied = 0
    for rows in order:
        ids_m, att_m, resp_m, idx_m = ids[rows], attention[rows], response[rows], index[rows]
        one_hot = jax.nn.one_hot(idx_m, 8) * resp_m[..., None]  # [n, L, A]: token -> its step
        step_mask = (one_hot.sum(axis=1) > 0).astype(jnp.float32)  # [n, A]

        def critic_loss(params):
            values = critic_values(critic_graphdef, params, ids_m, att_m)
            if algorithm == "appo":  # one value per step: at its first token
                v = jnp.einsum("nl,nla->na", values * first[rows], one_hot)
                old = step_values[rows]
                return openr_value_loss(v, old, step_ret[rows], config.value_clip, config.huber_delta, step_mask)
            old = token_values[rows]
            return openr_value_loss(values, old, token_ret[rows], config.value_clip, config.huber_delta, resp_m)

        grads = jax.grad(critic_loss)(critic_params)
        updates, critic_opt = optimizer.update(grads, critic_opt, critic_params)
        critic_params = optax.apply_updates(critic_params, updates)

        def policy_loss(params):
            logp, entropy = policy_logprobs(policy_graphdef, params, ids_m, att_m)
            old = old_logprobs[rows]
            if algorithm == "appo":
                new_joint = jnp.einsum("nl,nla->na", logp * resp_m, one_hot)
                old_joint = jnp.einsum("nl,nla->na", old * resp_m, one_hot)
                step_entropy = jnp.einsum("nl,nla->na", entropy * resp_m, one_hot) / jnp.maximum(one_hot.sum(1), 1)
                units = step_mask > 0
                adv = step_adv[rows][np.asarray(units)]
                adv = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)  # torch's std: unbiased
                log_ratio = (new_joint - old_joint)[units]
                ratio = jnp.exp(log_ratio)
                approx_kl = jnp.mean((ratio - 1) - log_ratio)
                surr = jnp.maximum(-jnp.clip(ratio, 0.8, 1.2) * adv, -ratio * adv)
                return surr.mean() - config.entropy_coef * step_entropy[units].mean(), approx_kl
            adv = token_adv[rows]
            nonzero = adv[(adv != 0) & (resp_m > 0)]
            adv = (adv - nonzero.mean()) / (nonzero.std() + 1e-8)  # np.nanstd: biased
            log_ratio = logp - old
            ratio = jnp.exp(log_ratio)
            surr = jnp.maximum(-jnp.clip(ratio, 0.8, 1.2) * adv, -ratio * adv) - config.entropy_coef * entropy
            approx_kl = jnp.sum(((ratio - 1) - log_ratio) * resp_m) / resp_m.sum()
            return jnp.sum(surr * resp_m) / resp_m.sum(), approx_kl

        (_, approx_kl), grads = jax.value_and_grad(policy_loss, has_aux=True)(policy)
        if approx_kl > config.target_kl:
            continue
        updates, policy_opt = optimizer.update(grads, policy_opt, policy)
        policy = optax.apply_updates(policy, updates)
        applied += 1
    return policy, critic_params, applied


# ----------------------------------------------------------------------------- the comparison


@pytest.mark.parametrize("algorithm", ["appo", "tppo"])
def test_one_update_equals_openr(algorithm):
    config = recipe(algorithm)
    config.algorithm_name = algorithm
    policy_graphdef, policy, critic_graphdef, critic_params = models()
    ids, attention, response, index, step_rewards = episodes()
    optimizer = optax.sgd(LR)
    state = create_train_state(policy, optimizer, seed=3, critic_params=critic_params, critic_optimizer=optimizer)
    _, order = minibatch_order(state.rng, N, config.ppo_epoch, config.num_mini_batch)
    order = np.asarray(order)
    old = np.asarray(policy_logprobs(policy_graphdef, policy, ids, attention)[0]) * response
    old[order[0][:ROWS_OFF_POLICY]] -= 0.3 * response[order[0][:ROWS_OFF_POLICY]]  # sampled by another policy

    batch = {
        "input_ids": jnp.asarray(ids),
        "attention_mask": jnp.asarray(attention),
        "response_mask": jnp.asarray(response),
        "old_logprobs": jnp.asarray(old),
    }
    values = critic_values(critic_graphdef, critic_params, ids, attention)
    batch.update(
        advantages_lib.compute_advantages(
            algorithm,
            batch,
            jnp.zeros(N),  # reward_source="prm": step rewards only
            values=values,
            gamma=config.gamma,
            lam=config.lam,
            action_index=jnp.asarray(index),
            action_rewards=jnp.asarray(step_rewards),
            whiten=config.advantage_whitening == "batch",
        )
    )
    update = make_update_fn(
        policy_graphdef,
        optimizer,
        sections.update_config(config),
        critic_graphdef=critic_graphdef,
        critic_optimizer=optimizer,
        donate=False,
    )
    new_state, metrics = update(state, batch)

    want_policy, want_critic, applied = openr_update(
        algorithm, config, order, ids, attention, response, index, step_rewards, old
    )
    assert applied == config.num_mini_batch - 1  # the off-policy minibatch skipped its policy step, only it
    assert float(metrics["kl_skipped_fraction"]) == pytest.approx(1 / config.num_mini_batch)
    for got, want, start in (
        (new_state.params, want_policy, policy),
        (new_state.critic_params, want_critic, critic_params),
    ):
        moved = 0.0
        for g, w, s in zip(jax.tree.leaves(got), jax.tree.leaves(want), jax.tree.leaves(start)):
            np.testing.assert_allclose(
                np.asarray(g) - np.asarray(s), np.asarray(w) - np.asarray(s), rtol=2e-5, atol=1e-5
            )
            moved = max(moved, float(np.abs(np.asarray(w) - np.asarray(s)).max()))
        assert moved > 1e-3  # the comparison is of real steps


def test_the_appo_critic_is_trained_on_each_steps_first_token():
    """The issue's case: [5, SEP | 6, 7], step rewards [0, 1], gamma = lambda = 1, old values [.5, .9, .2, .3],
    current = old + 0.1: OpenR's value loss over the two steps (MSE) is 0.1625, not the all-token 0.12625."""
    batch = {
        "input_ids": jnp.array([[1, 5, 9, 6, 7]]),
        "response_mask": jnp.array([[0, 1, 1, 1, 1]], jnp.float32),
        "old_logprobs": jnp.zeros((1, 5)),
    }
    old = jnp.array([[0.0, 0.5, 0.9, 0.2, 0.3]])
    out = advantages_lib.compute_advantages(
        "appo",
        batch,
        jnp.zeros(1),
        values=old,
        gamma=1.0,
        lam=1.0,
        action_index=jnp.array([[0, 0, 0, 1, 1]]),
        action_rewards=jnp.array([[0.0, 1.0]]),
        whiten=False,
    )
    loss, _ = losses.clipped_value_loss(old + 0.1, out["old_values"], out["returns"], out["value_mask"])
    assert float(loss) == pytest.approx(0.1625, abs=1e-6)
    np.testing.assert_array_equal(out["value_mask"], [[0, 1, 0, 1, 0]])


def test_answers_with_many_steps_are_never_merged():
    """Steps past any default limit: the advantages equal a per-step recursion (no step folded into another),
    and a row with more steps than an explicit max_actions is an error."""
    steps, per = 20, 2
    L = steps * per
    batch = {
        "input_ids": jnp.zeros((1, L), jnp.int32),
        "response_mask": jnp.ones((1, L)),
        "old_logprobs": jnp.zeros((1, L)),
    }
    rng = np.random.default_rng(0)
    values = rng.normal(size=(1, L)).astype(np.float32)
    rewards = rng.uniform(size=(1, steps)).astype(np.float32)
    index = np.repeat(np.arange(steps), per)[None]

    def advantages(algorithm):
        return advantages_lib.compute_advantages(
            algorithm,
            batch,
            jnp.zeros(1),
            values=jnp.asarray(values),
            gamma=0.9,
            lam=0.8,
            action_index=jnp.asarray(index),
            action_rewards=jnp.asarray(rewards),
            whiten=False,
        )["advantages"]

    want, _ = tppo_gae(rewards, values, index, np.ones((1, L)), 0.9, 0.8)
    np.testing.assert_allclose(advantages("tppo"), want, atol=1e-5)
    step_adv, _ = appo_gae(rewards, values[:, ::per], [steps], 0.9, 0.8)
    np.testing.assert_allclose(advantages("appo"), np.repeat(step_adv, per, axis=1), atol=1e-5)
    with pytest.raises(ValueError, match="max_actions=8"):
        advantages_lib.compute_advantages(
            "appo", batch, jnp.zeros(1), values=jnp.asarray(values), action_index=jnp.asarray(index), max_actions=8
        )
    with pytest.raises(ValueError, match="action_rewards has 8 columns"):
        advantages_lib.compute_advantages(
            "appo",
            batch,
            jnp.zeros(1),
            values=jnp.asarray(values),
            action_index=jnp.asarray(index),
            action_rewards=jnp.asarray(rewards[:, :8]),
        )


# Qwen2's pre-tokenizer pattern (its tokenizer.json): newlines attach to the punctuation before them.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@pytest.fixture(scope="module")
def qwen2_style_codec(tmp_path_factory):
    """A byte-level BPE with Qwen2's pre-tokenizer, trained on step-by-step solutions: it learns `.\\n\\n`-style
    tokens, as Qwen's vocabulary has."""
    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    rng = np.random.default_rng(0)
    corpus = [
        f"First, {a} plus {b} is {a + b}.\n\nThen {a + b} times 2 is {2 * (a + b)}:\n\nSo the answer is "
        f"\\boxed{{{2 * (a + b)}}}.\n\n"
        for a, b in rng.integers(0, 50, (300, 2))
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]
    )
    tokenizer.train_from_iterator(corpus, trainer)
    directory = tmp_path_factory.mktemp("qwen2_style")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>").save_pretrained(
        directory
    )
    return codec.TextCodec(str(directory))


def text_steps(text, separator):
    return [s.strip() for s in text.split(separator) if s.strip()] or [""]


@pytest.mark.parametrize(
    "text",
    [
        "First, 3 plus 4 is 7.\n\nThen 7 times 2 is 14:\n\nSo the answer is \\boxed{14}.",
        "\n\nFirst, 3 plus 4 is 7.\n\n\n\nThen 7 times 2 is 14.\n\n",  # leading, doubled and trailing separators
        "So the answer is \\boxed{14}.",  # one step
    ],
)
def test_steps_split_where_the_text_has_the_separator_under_a_qwen2_style_tokenizer(qwen2_style_codec, text):
    codec, separator = qwen2_style_codec, "\n\n"
    ids = codec.encode(text)
    pieces = [codec.token_text(t) for t in ids]
    index = advantages_lib.action_index_from_text(pieces, separator)
    steps = ["".join(p for p, i in zip(pieces, index) if i == k).strip() for k in range(index.max() + 1)]
    assert steps == text_steps(text, separator)  # the PRM's steps, token for token
    assert np.all(np.diff(index) >= 0)
    if text.startswith("First"):
        # The tokenizer merged the separator into `.\n\n` / `:\n\n`: the last token of encode("\n\n") ends no step.
        assert any(p.endswith(separator) and p != separator for p in pieces)
        by_token = losses.action_index_from_separators(
            jnp.asarray([ids]), jnp.ones((1, len(ids))), codec.encode(separator)[-1:]
        )
        assert int(by_token.max()) + 1 < len(text_steps(text, separator))


def test_a_math_subject_as_dataset_name_keeps_that_subjects_problems(tmp_path):
    import json

    from mathrl_jax.configs import default

    subjects = ["Prealgebra", "Number Theory", "Counting & Probability"]
    rows = [{"problem": f"What is {i}+1?", "answer": str(i + 1), "subject": subjects[i % 3]} for i in range(60)]
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = default.get_config()
    config.update(dataset_path=str(path), dataset_name="counting_and_probability", num_eval_problems=5)
    config.algorithm_name = "APPO"
    validation.validate_config(config)
    assert config.algorithm_name == "appo"
    train, held_out = problems.load_data(config)
    assert len(train) + len(held_out) == 20
    assert {p.subject for p in train + held_out} == {"Counting & Probability"}
    config.dataset_name = "geometry"
    with pytest.raises(TrainingError, match="counting_and_probability"):
        problems.load_data(config)
