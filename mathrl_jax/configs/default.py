"""The default configuration: the offline run, and every option a recipe may set.

`python scripts/train.py` with no arguments uses it: the tiny Qwen-architecture
model (written into the run directory, random weights), two-digit a+b / a-b,
the pure-JAX sampler, on the CPU. A supervised warm-start imitates a teacher
that works column by column but drops the carry 70% of the time
(`data/teacher.py`): the model learns the arithmetic and the teacher's slip, so
greedy decoding fails the problems that carry while sampling still gets them
right about 30% of the time. GRPO against the math verifier then has to find
and keep the carry. `--config.shuffle_rewards=True --config.run_dir=runs/control`
is the control: the same run with the rewards shuffled within each batch.

Every recipe file (`configs/<name>.py`) starts from `get_config()` here and
changes fields. `OPTIONS` below is the one place each option is defined: its
default, type, bounds, meaning and resume policy (`mathrl_jax/options.py`); the
config, `--help`, the range checks and the resume rule all come from it.
Override any field on the command line: `--config.lr=1e-5`, `--config.mesh.tp=2`.
"""

from mathrl_jax.options import MAY_CHANGE, NEVER, Option, Section, config_from, group

OPTIONS = (
    *group(
        "run",
        Option(
            "algorithm_name",
            "grpo",
            "grpo drgrpo dapo ppo appo tppo reinforce_rebn async_ppo rloo reinforce_pp",
            choices="mathrl_jax.train.algorithms:NAMES",
            case_free=True,
        ),
        Option("seed", 0),
        Option("run_dir", "runs/default", resume=MAY_CHANGE),
        Option(
            "resume",
            True,
            "continue from the latest checkpoint in run_dir/checkpoints if there is one",
            resume=MAY_CHANGE,
        ),
        Option(
            "resume_allow_changes",
            "",
            (
                "A resumed run must train what the saved run did: keys that change what is trained (lr, "
                'model, data, ...) are refused unless named here, comma-separated ("lr,warmup_steps"); '
                "those marked resume=MAY_CHANGE in this table may change without it."
            ),
            resume=MAY_CHANGE,
        ),
        Option(
            "resume_allow_unverified",
            False,
            (
                "True: resume from a checkpoint step saved before checksums were kept, which nothing can "
                "verify (a warning names it). False: such a step stops the run (exit 2, naming it). A "
                "step whose checksums were lost (its metadata lists them) is refused either way, as a "
                "damaged one: the newest intact step is restored instead."
            ),
            resume=MAY_CHANGE,
        ),
    ),
    *group(
        "model",
        Option("model_name_or_path", "", 'a local HF checkpoint; "" = the tiny offline model (written to run_dir)'),
        Option("prm_model_name_or_path", "", 'a local PRM checkpoint (stepwise rewards); "" = none'),
        Option(
            "param_dtype",
            "float32",
            (
                "Mixed precision as verl, TRL and AReaL: `param_dtype` holds the master weights and "
                "AdamW's moments (keep float32: an lr of 1e-6 moves bfloat16 weights not at all), `dtype`"
                " the compute (bfloat16 at real sizes). Checkpoints and final_model keep param_dtype "
                "(scripts/export_hf.py --dtype bfloat16 halves an export); vLLM gets vllm.dtype (default:"
                " dtype) at every sync."
            ),
        ),
        Option("dtype", "float32"),
        Option("remat", False, resume=MAY_CHANGE),
        Option(
            "scan_layers",
            False,
            (
                "True: the training passes run the decoder layers as one lax.scan, so XLA compiles one "
                "layer (the 1.5B update compiles 2.4x faster on CPU). It stacks the layers' weights in "
                "the pass, which costs about twice their size in the compute dtype; with few tokens per "
                "micro-batch that outweighs what it saves. On XLA:CPU remat saves memory only with the "
                "layers scanned (docs/real_shapes.md#few-compiles)."
            ),
            resume=MAY_CHANGE,
        ),
        Option(
            "attention",
            "auto",
            (
                "The training passes' attention: \"auto\" (the blocked einsum on CPU; cuDNN's fused kernel "
                "on an NVIDIA GPU of compute capability >= 8.0 in bf16 / fp16, "
                "jax.nn.dot_product_attention's XLA form otherwise: see models.attention.auto_attention),"
                ' "blocked", "xla", or "cudnn".'
            ),
            resume=MAY_CHANGE,
            choices="mathrl_jax.models.attention:ATTENTION_IMPLEMENTATIONS",
        ),
        Section(
            "lora",
            (
                "LoRA (models/lora.py): rank > 0 trains low-rank adapters on the named projections "
                '("q_proj,v_proj" as OpenR, "all-linear" for every decoder projection) with the base frozen; '
                "the policy's optimizer state and checkpoint hold its adapters alone. alpha / rank scales "
                "them (PEFT's lora_alpha). rank 0: every weight trains. share_critic_base: the critic (PPO "
                "family) is the policy's frozen base, adapters off, under OpenR's MLP value head, which alone"
                " trains (value_head.FrozenBaseCritic); False: a critic of its own that trains every weight."
            ),
        ),
        Option("lora.rank", 0, low=0, resume=NEVER),
        Option("lora.alpha", 16.0, low=0.0, low_open=True),
        Option("lora.targets", "q_proj,v_proj", resume=NEVER),
        Option("lora.share_critic_base", False, resume=NEVER),
        Option(
            "lora.dropout",
            0.0,
            (
                "PEFT's lora_dropout: during the update, each adapter's input is dropped with this probability "
                "(inverted dropout: the kept entries scaled by 1 / (1 - p)); never while sampling, evaluating or "
                "merging. 0 = none."
            ),
            low=0.0,
            high=0.95,
        ),
    ),
    *group(
        "data",
        Option("dataset_name", "arithmetic", "arithmetic, countdown, or a layout: auto math500 gsm8k areal_boba"),
        Option("dataset_path", "", "JSONL / parquet / datasets dir / a dataset's Hub id in the local cache"),
        Option("eval_dataset_path", "", '"" = a held-out split of the training source', resume=MAY_CHANGE),
        Option(
            "dataset_split",
            "",
            (
                'The split of a dataset folder or Hub dataset that holds several ("train", "test"); "" '
                "for one that holds one"
            ),
        ),
        Option("eval_dataset_split", "", resume=MAY_CHANGE),
        Option(
            "eval_holdout",
            -1,
            (
                "With no eval_dataset_path (and no eval_dataset_split): how many problems of the training file are "
                "held out for evaluation, drawn with the run's seed (the run says how many, and from where). -1 = "
                "min(num_eval_problems, a tenth of the file); 0 = none (every problem trains; no held-out "
                "evaluation); N = N problems."
            ),
            low=-1,
        ),
        Section(
            "data",
            (
                "fields: a mapping from the layout's field names to your file's, comma-separated "
                '"ROLE:FIELD" pairs ("question:problem,answer:gold"); ROLE is question, answer, solution, uid, '
                'level or subject. Given, it defines the layout (dataset_name "auto" or "custom"). "" = the '
                "layout's own fields."
            ),
        ),
        Option("data.fields", ""),
        Section("arithmetic", ""),
        Option("arithmetic.levels", (2,)),
        Option("arithmetic.num_train", 8000, low=1),
        Option("arithmetic.num_eval", 500, low=0),
        Option("arithmetic.question_format", "{expr}="),
        Option(
            "arithmetic.digits",
            2,
            (
                "Level 2's operand digits, 2 to 10: the column chain's horizon (configs/column_chain.py);"
                " 2 = the default task. It is the number of columns of the teacher's worked solutions and"
                " of the process verifier's steps."
            ),
        ),
        Option(
            "arithmetic.eval_digits",
            0,
            (
                "0, or a second held-out set at this many digits (2 to 10; e.g. digits + 2: length "
                "generalisation), eval_hard/*: num_eval_problems problems of level 2, evaluated beside "
                "the first (greedy at each evaluation, pass@k at the first and last), never trained on."
            ),
            resume=MAY_CHANGE,
        ),
        Section(
            "countdown",
            (
                'dataset_name="countdown" (configs/countdown.py, data/countdown/): reach the target from '
                "`count` numbers (3 to 6), each in [min_number, max_number], with + - *, each number used "
                'once: "3,7,5->26:" is answered "7*3=21,21+5=26,\\boxed{26}". Targets 1 to max_target. '
                "num_train training problems (repeats allowed) and num_eval distinct held-out ones. The "
                "reward is a valid derivation of the target, not the boxed number "
                "(rewards/countdown_grader.py); the warm-start teacher combines the numbers left to right "
                "with + and * only."
            ),
        ),
        Option("countdown.count", 3),
        Option("countdown.min_number", 1),
        Option("countdown.max_number", 9),
        Option("countdown.max_target", 99),
        Option("countdown.num_train", 8000, low=1),
        Option("countdown.num_eval", 500, low=0),
        Option(
            "countdown.eval_count",
            0,
            (
                "0, or a second held-out set of countdown instances with this many numbers (3 to 6; count"
                " + 1: the harder split), eval_hard/*: num_eval_problems problems, evaluated beside the "
                "first as arithmetic.eval_digits's."
            ),
            resume=MAY_CHANGE,
        ),
        Option(
            "prompt_template",
            "plain",
            "plain boxed verl_boxed r1_zero chat chat_plain",
            choices="mathrl_jax.data.prompts:TEMPLATE_NAMES",
        ),
        Option("max_prompt_length", 16, low=1),
        Option(
            "num_eval_problems",
            500,
            "200 problems give about +-3 points of noise; 500 about +-2",
            low=0,
            resume=MAY_CHANGE,
        ),
    ),
    *group(
        "rollout",
        Option("sampler", "jax", "jax | vllm", resume=MAY_CHANGE, choices=("jax", "vllm"), case_free=True),
        Section(
            "jax_sampler",
            (
                'The JAX sampler (sampler="jax", and the warm-start\'s evaluations): kv_cache_gib bounds the '
                "KV cache of one prefill + decode; a batch over it runs in sub-batches of prompts (same "
                "samples). An out-of-memory names it. compact_interval: every this many decode steps the "
                "running rows move into a batch a quarter as large once they fit (same samples; 0 = never): a"
                " long answer's tail stops paying for the rows that have finished. jax_sampler.lora_sync: a "
                'LoRA policy reaches the JAX sampler merged into its kernels at each sync ("merged", the '
                'faster: docs/training.md#lora) or as adapters applied in each projection ("adapter": no '
                "kernel copied)"
            ),
        ),
        Option("jax_sampler.kv_cache_gib", 16.0, resume=MAY_CHANGE, low=0.0, low_open=True),
        Option("jax_sampler.compact_interval", 256, resume=MAY_CHANGE, low=0),
        Option("jax_sampler.lora_sync", "merged", choices="mathrl_jax.sampling.base:LORA_SYNCS"),
        Section(
            "vllm",
            (
                'The vLLM engine (sampler="vllm"; docs/vllm.md). kv_cache_gib: the KV cache\'s size, host '
                "memory on vLLM's CPU build, GPU memory on a GPU; it bounds the tokens in flight, not a "
                "request's length. dtype: the engine's weights and compute, \"\" = config.dtype (a bfloat16 "
                "engine beside a float32 trainer: consider tis_cap). vllm.lora_sync: a LoRA policy reaches "
                'vLLM as merged weights ("merged") or as vLLM\'s own LoRA adapters ("adapter": a LoRARequest '
                "per sync); see docs/training.md#lora for which is faster. tensor_parallel_size: the "
                "in-process engine's workers (> 1: one process each, synced through vLLM's weight transfer). "
                'server_url: "" = the engine in this process; "http://host:port" = rollouts from a vLLM '
                "server started with scripts/vllm_server.py (kv_cache_gib, tensor parallel and dtype are then"
                " the server's own). timeout_s: the longest one request to a server may take before the run "
                'stops naming it (exit 2). transfer: how weights reach an engine in other processes: "auto" '
                "(in-process workers: shared memory; a server: the engine it was started with), "
                '"mathrl_shared_memory" (files in /dev/shm: one host), "nccl" (a GPU server; not run yet). '
                "transfer_chunk_gib: the most one transfer step holds (a file in /dev/shm, NCCL's buffer)"
            ),
        ),
        Option("vllm.kv_cache_gib", 1.0, resume=MAY_CHANGE, low=0.0, low_open=True),
        Option("vllm.dtype", "", resume=MAY_CHANGE),
        Option("vllm.lora_sync", "merged", resume=MAY_CHANGE, choices="mathrl_jax.sampling.base:LORA_SYNCS"),
        Option("vllm.tensor_parallel_size", 1, resume=MAY_CHANGE, low=1),
        Option("vllm.server_url", "", resume=MAY_CHANGE),
        Option("vllm.timeout_s", 600.0, resume=MAY_CHANGE, low=0.0, low_open=True),
        Option("vllm.transfer", "auto", resume=MAY_CHANGE, choices="mathrl_jax.sampling.vllm.plugin:TRANSFERS"),
        Option("vllm.transfer_chunk_gib", 1.0, resume=MAY_CHANGE, low=0.0, low_open=True),
        Option("n_rollout_threads", 32, "prompts per iteration", low=1),
        Option("group_size", 8, "samples per prompt (GRPO's G)", low=1),
        Option("episode_length", 1, "turns per episode (multi-turn envs) / steps (step-wise)", low=1),
        Option("max_new_tokens", 40, "the warm-start's worked solutions take up to 33 tokens with EOS", low=1),
        Option("temperature", 1.0, low=0.0, low_open=True),
        Option("top_p", 1.0, low=0.0, low_open=True, high=1.0),
        Option("top_k", 0, low=-1),
        Option(
            "min_p",
            0.0,
            (
                "vLLM's min_p: a token is kept only if its probability is at least min_p times the most likely "
                "token's (after temperature); 0 = off. Both samplers."
            ),
            low=0.0,
            high=1.0,
        ),
        Option(
            "repetition_penalty",
            1.0,
            (
                "vLLM's (and transformers') repetition_penalty: the logit of every token already in the prompt or "
                "the completion is divided by it where positive, multiplied where negative; 1 = off. Both samplers."
            ),
            low=0.0,
            low_open=True,
        ),
        Option("num_iterations", 40, resume=MAY_CHANGE, low=0),
        Option(
            "num_env_steps",
            0,
            "if > 0: iterations = num_env_steps / (n_rollout_threads * group_size * episode_length)",
            resume=MAY_CHANGE,
            low=0,
        ),
    ),
    *group(
        "reward",
        Option(
            "reward_source",
            "verifier",
            "verifier | prm | prm+verifier (PRM step scores on action ends) | functions | verifier+functions",
            choices=("verifier", "prm", "prm+verifier", "functions", "verifier+functions"),
        ),
        Section("prm", ""),
        Option("prm.step_tag", "ки"),
        Option("prm.candidate_tokens", ("+", "-")),
        Option("env_name", "", '"" = single-turn problems; guess_number = GEM\'s multi-turn game (reinforce_rebn)'),
        Section(
            "guess_number",
            ("guess_number's own options (GEM's defaults): the range and the turn budget (GEM's GuessTheNumber-v0)."),
        ),
        Option("guess_number.min_number", 1),
        Option("guess_number.max_number", 20),
        Option("guess_number.max_turns", 20),
        Section(
            "reward",
            (
                'reward.functions: your own reward functions (reward_source "functions" or '
                '"verifier+functions"), comma-separated "module:function" or "path/to/file.py:function", '
                "called as TRL calls its reward_funcs (rewards/functions.py); reward.weights: one per "
                'function, comma-separated ("" = 1 each); reward.function_timeout_s: the longest one call of '
                "a function may take (seconds): past it the run stops naming it (exit 2); each function runs "
                "in a process of its own, killed at the limit. Each result must be one number (or None) per "
                "completion, finite in float32, else the run stops naming the function and value."
            ),
        ),
        Option("reward.correct", 1.0),
        Option("reward.incorrect", 0.0),
        Option("reward.no_answer", 0.0),
        Option("reward.format_reward", 0.0),
        Option("reward.timeout_s", 5.0, low=0.0, low_open=True),
        Option("reward.num_workers", 2, low=1, resume=MAY_CHANGE),
        Option("reward.functions", ""),
        Option("reward.weights", ""),
        Option("reward.function_timeout_s", 60.0, low=0.0, low_open=True, resume=MAY_CHANGE),
        Option(
            "shuffle_rewards",
            False,
            (
                "The control: each response's rewards (the verifier's, a PRM's step scores) given to "
                "another response of the batch (same distribution, no information)."
            ),
        ),
    ),
    *group(
        "update",
        Option("ppo_epoch", 1, low=1),
        Option("num_mini_batch", 4, low=1),
        Option("micro_batch_size", 0, "0 = the whole minibatch", resume=MAY_CHANGE, low=0),
        Option(
            "old_logprobs",
            "auto",
            (
                "PPO's old log-probs: \"trainer\" recomputes them with the trainer's params (verl, TRL); "
                "\"sampler\" takes the sampler's log-probs of the sampled tokens (AReaL's "
                "recompute_logprob=False); \"auto\" takes the sampler's where they are the trainer's up to "
                "float rounding (the JAX sampler, which holds the trainer's params, at temperature 1, "
                "single-turn, not the decoupled loss, which needs both), else recomputes."
            ),
            choices=("auto", "sampler", "trainer"),
        ),
        Option(
            "packing",
            True,
            (
                "Sequence packing: the trainer's passes run on rows filled with whole sequences "
                "(first-fit, by segment ids) instead of one padded row per sequence; a micro-batch is "
                "then micro_batch_size x the batch width in tokens."
            ),
            resume=MAY_CHANGE,
        ),
        Option(
            "pack_length",
            128,
            "tokens per packed row; at least the batch width (the longest prompt + completion)",
            resume=MAY_CHANGE,
            low=0,
        ),
        Option(
            "skip_zero_advantage",
            True,
            (
                "With packing, rows whose every advantage is 0 (a GRPO group whose samples all earned the"
                " same reward) are left out of the update's forward and backward passes where that "
                "changes no gradient: a policy loss that is 0 at zero advantage, no KL or entropy term, "
                "no critic, no per-minibatch whitening, no target_kl. They still count in the loss's "
                "denominator; the update's per-token metrics (entropy, ratios, clip fractions) are then "
                "over the rows that train (with packing=False too, where the rows are computed all the "
                "same)."
            ),
            resume=MAY_CHANGE,
        ),
        Option(
            "lr",
            3e-5,
            (
                "Small: RL starts a fresh Adam on a warm-started policy, and Adam's first steps move "
                "every weight by ~lr (1e-4 already makes the offline default's held-out accuracy swing by"
                " 10 points between evaluations)."
            ),
            low=0.0,
            low_open=True,
        ),
        Option("critic_lr", 0.001, low=0.0, low_open=True),
        Option("lr_schedule", "constant", "constant linear cosine", choices="mathrl_jax.train.state:SCHEDULES"),
        Option("warmup_steps", 10, low=0),
        Option(
            "optimizer",
            "adamw",
            (
                '"adamw", or "adafactor" (a factored second moment and no first: the optimizer state of a'
                ' 1.5B model falls from 12 GB to a few MB; TRL\'s `optim="adafactor"`). The critic uses '
                "the same."
            ),
            choices="mathrl_jax.train.state:OPTIMIZERS",
            case_free=True,
        ),
        Option("weight_decay", 0.0, low=0.0),
        Option("max_grad_norm", 1.0, low=0.0, low_open=True),
        Option("adam_eps", 1e-8, "OpenR: 1e-5", low=0.0, low_open=True),
        Option("clip_low", 0.2, low=0.0, high=1.0),
        Option("clip_high", None, "None = clip_low; DAPO: 0.28", value_type=float, low=0.0),
        Option("clip_c", None, "dual clip", value_type=float, low=1.0, low_open=True),
        Option("loss_agg_mode", "token-mean", choices="mathrl_jax.losses.aggregate:LOSS_AGG_MODES"),
        Option(
            "mask_truncated_completions",
            False,
            (
                "TRL's mask_truncated_completions (DAPO's overlong filtering): a completion cut at max_new_tokens "
                "(no EOS) trains nothing: its tokens leave the loss; it still counts in its group's statistics."
            ),
        ),
        Option("entropy_coef", 0.0),
        Option("kl_coef", 0.0, "KL to the reference, in the loss", low=0.0),
        Option("kl_kind", "k3", choices="mathrl_jax.losses.kl:KL_KINDS", case_free=True),
        Option("kl_reward_coef", 0.0, "KL to the reference, in the reward (PPO family)", low=0.0),
        Option("gamma", 1.0, low=0.0, high=1.0),
        Option("lam", 0.95, low=0.0, high=1.0),
        Option(
            "target_kl",
            None,
            "OpenR: a minibatch whose approx-KL is over it skips its policy step (0.02)",
            value_type=float,
            low=0.0,
            low_open=True,
        ),
        Option("step_separator", "\n", "APPO / TPPO / PRM steps end where the tokens' text has this"),
        Option("appo_action_ratio", True, "appo: one importance ratio per action (OpenR); False: per token"),
        Option(
            "advantage_whitening",
            "batch",
            "batch: over the batch's tokens; openr: per minibatch, as OpenR",
            choices=("batch", "openr"),
        ),
        Option(
            "value_loss_type",
            "mse",
            "mse | huber | huber_one_sided (OpenR's `huber_loss`)",
            choices="mathrl_jax.losses.value:VALUE_LOSS_TYPES",
        ),
        Option("huber_delta", 10.0, low=0.0, low_open=True),
        Option("value_clip", 0.2, "the critic's value clip (OpenR: clip_param)", low=0.0),
        Section("dapo", ""),
        Option("dapo.success_rate_lb", 0.0, low=0.0, high=1.0),
        Option("dapo.success_rate_ub", 1.0, low=0.0, high=1.0),
        Option("dapo.overlong_buffer_len", 0, low=0),
        Option("dapo.overlong_penalty_factor", 1.0, low=0.0),
        Option(
            "max_head_offpolicyness",
            0,
            (
                "async_ppo: how many versions a rollout may lag. Any other single-turn algorithm at > 0 "
                "trains on rollouts sampled exactly that many versions behind (after the first few), the "
                "testbed's staleness knob: old log-probs recomputed by the trainer, or with "
                'old_logprobs="sampler" the behaviour policy\'s (naive PPO), or tis_cap.'
            ),
            low=0,
        ),
        Option(
            "sampler_logprob_noise",
            0.0,
            (
                "The testbed's mismatch knob: Gaussian noise of this many nats (standard deviation) added"
                " to the sampler's log-prob of every sampled token, as a sampler whose kernels disagree "
                "with the trainer's would report them. Only what reads the sampler's log-probs feels it: "
                'old_logprobs="sampler", tis_cap, async_ppo\'s behaviour.'
            ),
            low=0.0,
        ),
        Option("behaviour_weight_cap", None, value_type=float, low=0.0, low_open=True),
        Option(
            "tis_cap",
            None,
            (
                "Truncated importance sampling (TIS) against the sampler-trainer mismatch: each token's "
                "policy loss weighted by min(pi_trainer / pi_sampler, tis_cap) "
                "(losses.truncated_importance_weights). None = off; 2.0 = verl's / TRL's. For a sampler "
                "that is not the trainer (vLLM, above all a bfloat16 engine); the trainer recomputes the "
                "old log-probs for it. Token-level losses only (ppo, reinforce); async_ppo's decoupled "
                "loss corrects this itself."
            ),
            value_type=float,
            low=0.0,
            low_open=True,
        ),
    ),
    *group(
        "warm-start (before RL, same command)",
        Section(
            "warmstart",
            (
                'targets: "teacher" = worked column-by-column solutions from a teacher that drops the carry /'
                " borrow with probability slip_rate (data/teacher.py; arithmetic level 2 only); with "
                'dataset_name="countdown", its teacher\'s left-to-right chains whose last operator slips with '
                'probability slip_rate (data/countdown/teacher.py); "answer" = the bare "\\boxed{answer}" '
                "(not for countdown, whose gold answer is the instance). With env_name (guess_number): the "
                "turns of a teacher's games, binary search whose guess slips to the smallest candidate with "
                "probability slip_rate (envs/guess_number_teacher.py)."
            ),
        ),
        Option("warmstart.steps", 1200, low=0),
        Option("warmstart.batch_size", 32, low=1),
        Option("warmstart.lr", 0.001, low=0.0, low_open=True),
        Option("warmstart.warmup_steps", 50, low=0),
        Option("warmstart.targets", "teacher", choices=("teacher", "answer")),
        Option("warmstart.slip_rate", 0.7, low=0.0, high=1.0),
    ),
    *group(
        "logging, evaluation, checkpoints",
        Option(
            "log_interval",
            1,
            "log an iteration's metrics every this many iterations (evaluations are always logged)",
            resume=MAY_CHANGE,
            low=1,
        ),
        Option("eval_interval", 10, resume=MAY_CHANGE, low=0),
        Option(
            "eval_n_samples",
            8,
            "at the first and last evaluation: pass@1 (sampled accuracy) .. pass@k at temperature",
            resume=MAY_CHANGE,
            low=0,
        ),
        Option(
            "num_logged_samples",
            8,
            "held-out prompts written with their completions to run_dir/samples/ at each eval",
            resume=MAY_CHANGE,
            low=0,
        ),
        Option(
            "log_completions",
            False,
            (
                "TRL's log_completions: every log_completions_every iterations, a table of prompts, completions, "
                "their rewards and advantages goes to run_dir/completions.jsonl and to the trackers (report_to)."
            ),
            resume=MAY_CHANGE,
        ),
        Option(
            "log_completions_every",
            10,
            "the iterations between two completion tables (log_completions)",
            resume=MAY_CHANGE,
            low=1,
        ),
        Option(
            "num_completions_to_print",
            8,
            "TRL's num_completions_to_print: rows of each completion table (log_completions)",
            resume=MAY_CHANGE,
            low=1,
        ),
        Option("save_interval", 20, resume=MAY_CHANGE, low=0),
        Option("max_to_keep", 2, low=1, resume=MAY_CHANGE),
        Option("progress", True, resume=MAY_CHANGE),
        Option(
            "report_to",
            "tensorboard",
            (
                'Where the metrics go besides run_dir/metrics.jsonl (always written): "tensorboard", '
                '"wandb", both ("tensorboard,wandb", TRL\'s report_to) or "none". wandb (pip install -e '
                "'.[wandb]') runs offline unless wandb_mode=\"online\": the run is kept in run_dir/wandb/ "
                "for `wandb sync`."
            ),
            resume=MAY_CHANGE,
        ),
        Option("wandb_project", "mathrl_jax", resume=MAY_CHANGE),
        Option("wandb_mode", "offline", resume=MAY_CHANGE, choices=("offline", "online")),
        Option(
            "export_final",
            True,
            "write the final policy to run_dir/final_model (Hugging Face format)",
            resume=MAY_CHANGE,
        ),
        Option(
            "compilation_cache_dir",
            "auto",
            (
                'JAX\'s persistent compilation cache (scripts/): "auto" = $JAX_COMPILATION_CACHE_DIR or '
                '~/.cache/mathrl_jax/jax_compilation_cache; "" = off'
            ),
            resume=MAY_CHANGE,
        ),
    ),
    *group(
        "scale",
        Option(
            "heartbeat_timeout_s",
            100,
            (
                "Several processes (jax.distributed, started by scripts/train.py from "
                "JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, SLURM or Open MPI): a "
                "process lost for this long aborts the others."
            ),
            resume=MAY_CHANGE,
            low=1,
        ),
        Option(
            "join_timeout_s",
            300,
            (
                "How long each process waits for all of them to join at start-up (JAX's "
                "initialization_timeout); one that refused its config, or never started, aborts the "
                "others after this long."
            ),
            resume=MAY_CHANGE,
            low=1,
        ),
        Section(
            "mesh",
            (
                "The trainer's mesh. One GPU: the defaults. One host with 8 GPUs: e.g. fsdp=-1 or fsdp=4 "
                "tp=2. Several hosts: the same flags, over the devices of all hosts."
            ),
        ),
        Option("mesh.dp", 1, resume=MAY_CHANGE),
        Option("mesh.fsdp", -1, resume=MAY_CHANGE),
        Option("mesh.tp", 1, resume=MAY_CHANGE),
        Section(
            "sampler_mesh",
            (
                "The sampler's mesh: an axis left unset follows the trainer's. E.g. data-parallel decoding "
                "beside a tensor-parallel trainer: --config.sampler_mesh.dp=-1 --config.sampler_mesh.fsdp=1 "
                "--config.sampler_mesh.tp=1."
            ),
        ),
        Option("sampler_mesh.dp", None, value_type=int, resume=MAY_CHANGE),
        Option("sampler_mesh.fsdp", None, value_type=int, resume=MAY_CHANGE),
        Option("sampler_mesh.tp", None, value_type=int, resume=MAY_CHANGE),
    ),
)


def get_config():
    """The default config: every option of `OPTIONS` at its default."""
    return config_from(OPTIONS)
