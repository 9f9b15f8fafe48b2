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
changes fields, so this file is the one place that lists every option and its
default. Override any field on the command line: `--config.lr=1e-5`,
`--config.mesh.tp=2`.
"""

import ml_collections

placeholder = ml_collections.config_dict.placeholder


def mesh_config(dp: int = 1, fsdp: int = -1, tp: int = 1) -> ml_collections.ConfigDict:
    """A mesh: dp x fsdp x tp devices; one of them may be -1, "the rest of the devices"."""
    return ml_collections.ConfigDict({"dp": dp, "fsdp": fsdp, "tp": tp})


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.algorithm_name = "grpo"  # grpo drgrpo dapo ppo appo tppo reinforce_rebn async_ppo rloo reinforce_pp
    config.seed = 0
    config.run_dir = "runs/default"
    config.resume = True  # continue from the latest checkpoint in run_dir/checkpoints if there is one
    # A resumed run must train what the saved run did: keys that change what is trained (lr, model, data, ...) are
    # refused unless named here, comma-separated ("lr,warmup_steps"); see train.resume.RESUME_MAY_CHANGE.
    config.resume_allow_changes = ""
    # True: resume from a checkpoint step saved before checksums were kept, which nothing can verify (a warning
    # names it). False: such a step stops the run (exit 2, naming it). A step whose checksums were lost (its metadata
    # lists them) is refused either way, as a damaged one: the newest intact step is restored instead.
    config.resume_allow_unverified = False

    # --- model -------------------------------------------------------------------------
    config.model_name_or_path = ""  # a local HF checkpoint; "" = the tiny offline model (written to run_dir)
    config.prm_model_name_or_path = ""  # a local PRM checkpoint (stepwise rewards); "" = none
    # Mixed precision as verl, TRL and AReaL: `param_dtype` holds the master weights and AdamW's moments (keep
    # float32: an lr of 1e-6 moves bfloat16 weights not at all), `dtype` the compute (bfloat16 at real sizes).
    # Checkpoints and final_model keep param_dtype (scripts/export_hf.py --dtype bfloat16 halves an export);
    # vLLM gets vllm.dtype (default: dtype) at every sync.
    config.param_dtype = "float32"
    config.dtype = "float32"
    config.remat = False
    # True: the training passes run the decoder layers as one lax.scan, so XLA compiles one layer (the 1.5B update
    # compiles 2.4x faster on CPU). It stacks the layers' weights in the pass, which costs about twice their size
    # in the compute dtype; with few tokens per micro-batch that outweighs what it saves. On XLA:CPU remat saves
    # memory only with the layers scanned (docs/real_shapes.md#few-compiles).
    config.scan_layers = False
    # The training passes' attention: "auto" (the blocked einsum on CPU; cuDNN's fused kernel on an NVIDIA GPU of
    # compute capability >= 8.0 in bf16 / fp16, jax.nn.dot_product_attention's XLA form otherwise: see
    # models.attention.auto_attention), "blocked", "xla", or "cudnn".
    config.attention = "auto"
    # LoRA (models/lora.py): rank > 0 trains low-rank adapters on the named projections ("q_proj,v_proj" as OpenR,
    # "all-linear" for every decoder projection) with the base frozen; the policy's optimizer state and checkpoint
    # hold its adapters alone. alpha / rank scales them (PEFT's lora_alpha). rank 0: every weight trains.
    # share_critic_base: the critic (PPO family) is the policy's frozen base, adapters off, under OpenR's MLP value
    # head, which alone trains (value_head.FrozenBaseCritic); False: a critic of its own that trains every weight.
    config.lora = ml_collections.ConfigDict(
        {"rank": 0, "alpha": 16.0, "targets": "q_proj,v_proj", "share_critic_base": False}
    )

    # --- data --------------------------------------------------------------------------
    config.dataset_name = "arithmetic"  # arithmetic, countdown, or a layout: auto math500 gsm8k areal_boba
    config.dataset_path = ""  # JSONL / parquet / datasets dir / a dataset's Hub id in the local cache
    config.eval_dataset_path = ""  # "" = a held-out split of the training source
    # The split of a dataset folder or Hub dataset that holds several ("train", "test"); "" for one that holds one
    config.dataset_split = ""
    config.eval_dataset_split = ""
    config.arithmetic = ml_collections.ConfigDict(
        {"levels": (2,), "num_train": 8000, "num_eval": 500, "question_format": "{expr}="}
    )
    # Level 2's operand digits, 2 to 10: the column chain's horizon (configs/column_chain.py); 2 = the default task.
    # It is the number of columns of the teacher's worked solutions and of the process verifier's steps.
    config.arithmetic.digits = 2
    # 0, or a second held-out set at this many digits (2 to 10; e.g. digits + 2: length generalisation), eval_hard/*:
    # num_eval_problems problems of level 2, evaluated beside the first (greedy at each evaluation, pass@k at the
    # first and last), never trained on.
    config.arithmetic.eval_digits = 0
    # dataset_name="countdown" (configs/countdown.py, data/countdown/): reach the target from `count` numbers (3 to
    # 6), each in [min_number, max_number], with + - *, each number used once: "3,7,5->26:" is answered
    # "7*3=21,21+5=26,\boxed{26}". Targets 1 to max_target. num_train training problems (repeats allowed) and
    # num_eval distinct held-out ones. The reward is a valid derivation of the target, not the boxed number
    # (rewards/countdown_grader.py); the warm-start teacher combines the numbers left to right with + and * only.
    config.countdown = ml_collections.ConfigDict(
        {"count": 3, "min_number": 1, "max_number": 9, "max_target": 99, "num_train": 8000, "num_eval": 500}
    )
    # 0, or a second held-out set of countdown instances with this many numbers (3 to 6; count + 1: the harder
    # split), eval_hard/*: num_eval_problems problems, evaluated beside the first as arithmetic.eval_digits's.
    config.countdown.eval_count = 0
    config.prompt_template = "plain"  # plain boxed verl_boxed r1_zero chat chat_plain
    config.max_prompt_length = 16
    config.num_eval_problems = 500  # 200 problems give about +-3 points of noise; 500 about +-2

    # --- rollout -----------------------------------------------------------------------
    config.sampler = "jax"  # jax | vllm
    # The JAX sampler (sampler="jax", and the warm-start's evaluations): kv_cache_gib bounds the KV cache of one
    # prefill + decode; a batch over it runs in sub-batches of prompts (same samples). An out-of-memory names it.
    # compact_interval: every this many decode steps the running rows move into a batch a quarter as large once
    # they fit (same samples; 0 = never): a long answer's tail stops paying for the rows that have finished.
    # jax_sampler.lora_sync: a LoRA policy reaches the JAX sampler merged into its kernels at each sync ("merged",
    # the faster: docs/training.md#lora) or as adapters applied in each projection ("adapter": no kernel copied)
    config.jax_sampler = ml_collections.ConfigDict(
        {"kv_cache_gib": 16.0, "compact_interval": 256, "lora_sync": "merged"}
    )
    # The vLLM engine (sampler="vllm"; docs/vllm.md). kv_cache_gib: the KV cache's size, host memory on vLLM's CPU
    # build, GPU memory on a GPU; it bounds the tokens in flight, not a request's length. dtype: the engine's
    # weights and compute, "" = config.dtype (a bfloat16 engine beside a float32 trainer: consider tis_cap).
    # vllm.lora_sync: a LoRA policy reaches vLLM as merged weights ("merged") or as vLLM's own LoRA adapters
    # ("adapter": a LoRARequest per sync); see docs/training.md#lora for which is faster.
    # tensor_parallel_size: the in-process engine's workers (> 1: one process each, synced through vLLM's weight
    # transfer). server_url: "" = the engine in this process; "http://host:port" = rollouts from a vLLM server
    # started with scripts/vllm_server.py (kv_cache_gib, tensor parallel and dtype are then the server's own).
    # timeout_s: the longest one request to a server may take before the run stops naming it (exit 2).
    # transfer: how weights reach an engine in other processes: "auto" (in-process workers: shared memory; a server:
    # the engine it was started with), "mathrl_shared_memory" (files in /dev/shm: one host), "nccl" (a GPU server;
    # not run yet). transfer_chunk_gib: the most one transfer step holds (a file in /dev/shm, NCCL's buffer)
    config.vllm = ml_collections.ConfigDict(
        {
            "kv_cache_gib": 1.0,
            "dtype": "",
            "lora_sync": "merged",
            "tensor_parallel_size": 1,
            "server_url": "",
            "timeout_s": 600.0,
            "transfer": "auto",
            "transfer_chunk_gib": 1.0,
        }
    )
    config.n_rollout_threads = 32  # prompts per iteration
    config.group_size = 8  # samples per prompt (GRPO's G)
    config.episode_length = 1  # turns per episode (multi-turn envs) / steps (step-wise)
    config.max_new_tokens = 40  # the warm-start's worked solutions take up to 33 tokens with EOS
    config.temperature = 1.0
    config.top_p = 1.0
    config.top_k = 0
    config.num_iterations = 40
    config.num_env_steps = 0  # if > 0: iterations = num_env_steps / (n_rollout_threads * group_size * episode_length)

    # --- reward ------------------------------------------------------------------------
    # verifier | prm | prm+verifier (PRM step scores on action ends) | functions | verifier+functions
    config.reward_source = "verifier"
    config.prm = ml_collections.ConfigDict({"step_tag": "ки", "candidate_tokens": ("+", "-")})
    config.env_name = ""  # "" = single-turn problems; guess_number = GEM's multi-turn game (reinforce_rebn)
    # guess_number's own options (GEM's defaults): the range and the turn budget (GEM's GuessTheNumber-v0).
    config.guess_number = ml_collections.ConfigDict({"min_number": 1, "max_number": 20, "max_turns": 20})
    # reward.functions: your own reward functions (reward_source "functions" or "verifier+functions"),
    # comma-separated "module:function" or "path/to/file.py:function", called as TRL calls its reward_funcs
    # (rewards/functions.py); reward.weights: one per function, comma-separated ("" = 1 each);
    # reward.function_timeout_s: the longest one call of a function may take (seconds): past it the run stops
    # naming it (exit 2); each function runs in a process of its own, killed at the limit. Each result must be
    # one number (or None) per completion, finite in float32, else the run stops naming the function and value.
    config.reward = ml_collections.ConfigDict(
        {
            "correct": 1.0,
            "incorrect": 0.0,
            "no_answer": 0.0,
            "format_reward": 0.0,
            "timeout_s": 5.0,
            "num_workers": 2,
            "functions": "",
            "weights": "",
            "function_timeout_s": 60.0,
        }
    )

    # The control: each response's rewards (the verifier's, a PRM's step scores) given to another response of the
    # batch (same distribution, no information).
    config.shuffle_rewards = False

    # --- update ------------------------------------------------------------------------
    config.ppo_epoch = 1
    config.num_mini_batch = 4
    config.micro_batch_size = 0  # 0 = the whole minibatch
    # PPO's old log-probs: "trainer" recomputes them with the trainer's params (verl, TRL); "sampler" takes the
    # sampler's log-probs of the sampled tokens (AReaL's recompute_logprob=False); "auto" takes the sampler's where
    # they are the trainer's up to float rounding (the JAX sampler, which holds the trainer's params, at temperature
    # 1, single-turn, not the decoupled loss, which needs both), else recomputes.
    config.old_logprobs = "auto"
    # Sequence packing: the trainer's passes run on rows filled with whole sequences (first-fit, by segment ids)
    # instead of one padded row per sequence; a micro-batch is then micro_batch_size x the batch width in tokens.
    config.packing = True
    config.pack_length = 128  # tokens per packed row; at least the batch width (the longest prompt + completion)
    # With packing, rows whose every advantage is 0 (a GRPO group whose samples all earned the same reward) are
    # left out of the update's forward and backward passes where that changes no gradient: a policy loss that is
    # 0 at zero advantage, no KL or entropy term, no critic, no per-minibatch whitening, no target_kl. They still
    # count in the loss's denominator; the update's per-token metrics (entropy, ratios, clip fractions) are then
    # over the rows that train (with packing=False too, where the rows are computed all the same).
    config.skip_zero_advantage = True
    # Small: RL starts a fresh Adam on a warm-started policy, and Adam's first steps move every weight by ~lr
    # (1e-4 already makes the offline default's held-out accuracy swing by 10 points between evaluations).
    config.lr = 3e-5
    config.critic_lr = 1e-3
    config.lr_schedule = "constant"  # constant linear cosine
    config.warmup_steps = 10
    # "adamw", or "adafactor" (a factored second moment and no first: the optimizer state of a 1.5B model falls
    # from 12 GB to a few MB; TRL's `optim="adafactor"`). The critic uses the same.
    config.optimizer = "adamw"
    config.weight_decay = 0.0
    config.max_grad_norm = 1.0
    config.adam_eps = 1e-8  # OpenR: 1e-5
    config.clip_low = 0.2
    config.clip_high = placeholder(float)  # None = clip_low; DAPO: 0.28
    config.clip_c = placeholder(float)  # dual clip
    config.loss_agg_mode = "token-mean"
    config.entropy_coef = 0.0
    config.kl_coef = 0.0  # KL to the reference, in the loss
    config.kl_kind = "k3"
    config.kl_reward_coef = 0.0  # KL to the reference, in the reward (PPO family)
    config.gamma = 1.0
    config.lam = 0.95
    config.target_kl = placeholder(float)  # OpenR: a minibatch whose approx-KL is over it skips its policy step (0.02)
    config.step_separator = "\n"  # APPO / TPPO / PRM steps end where the tokens' text has this
    config.appo_action_ratio = True  # appo: one importance ratio per action (OpenR); False: per token
    config.advantage_whitening = "batch"  # batch: over the batch's tokens; openr: per minibatch, as OpenR
    config.value_loss_type = "mse"  # mse | huber | huber_one_sided (OpenR's `huber_loss`)
    config.huber_delta = 10.0
    config.value_clip = 0.2  # the critic's value clip (OpenR: clip_param)
    config.dapo = ml_collections.ConfigDict(
        {"success_rate_lb": 0.0, "success_rate_ub": 1.0, "overlong_buffer_len": 0, "overlong_penalty_factor": 1.0}
    )
    # async_ppo: how many versions a rollout may lag. Any other single-turn algorithm at > 0 trains on rollouts
    # sampled exactly that many versions behind (after the first few), the testbed's staleness knob: old log-probs
    # recomputed by the trainer, or with old_logprobs="sampler" the behaviour policy's (naive PPO), or tis_cap.
    config.max_head_offpolicyness = 0
    # The testbed's mismatch knob: Gaussian noise of this many nats (standard deviation) added to the sampler's
    # log-prob of every sampled token, as a sampler whose kernels disagree with the trainer's would report them.
    # Only what reads the sampler's log-probs feels it: old_logprobs="sampler", tis_cap, async_ppo's behaviour.
    config.sampler_logprob_noise = 0.0
    config.behaviour_weight_cap = placeholder(float)
    # Truncated importance sampling (TIS) against the sampler-trainer mismatch: each token's policy loss weighted by
    # min(pi_trainer / pi_sampler, tis_cap) (losses.truncated_importance_weights). None = off; 2.0 = verl's / TRL's.
    # For a sampler that is not the trainer (vLLM, above all a bfloat16 engine); the trainer recomputes the old
    # log-probs for it. Token-level losses only (ppo, reinforce); async_ppo's decoupled loss corrects this itself.
    config.tis_cap = placeholder(float)

    # --- supervised warm-start (before RL, same command) ----------------------------------
    # targets: "teacher" = worked column-by-column solutions from a teacher that drops the carry / borrow with
    # probability slip_rate (data/teacher.py; arithmetic level 2 only); with dataset_name="countdown", its teacher's
    # left-to-right chains whose last operator slips with probability slip_rate (data/countdown/teacher.py);
    # "answer" = the bare "\\boxed{answer}" (not for countdown, whose gold answer is the instance).
    # With env_name (guess_number): the turns of a teacher's games, binary search whose guess slips to the
    # smallest candidate with probability slip_rate (envs/guess_number_teacher.py).
    config.warmstart = ml_collections.ConfigDict(
        {"steps": 1200, "batch_size": 32, "lr": 1e-3, "warmup_steps": 50, "targets": "teacher", "slip_rate": 0.7}
    )

    # --- logging / eval / checkpoints -------------------------------------------------------
    config.log_interval = 1
    config.eval_interval = 10
    config.eval_n_samples = 8  # at the first and last evaluation: pass@1 (sampled accuracy) .. pass@k at temperature
    config.num_logged_samples = 8  # held-out prompts written with their completions to run_dir/samples/ at each eval
    config.save_interval = 20
    config.max_to_keep = 2
    config.progress = True
    # Where the metrics go besides run_dir/metrics.jsonl (always written): "tensorboard", "wandb", both
    # ("tensorboard,wandb", TRL's report_to) or "none". wandb (pip install -e '.[wandb]') runs offline unless
    # wandb_mode="online": the run is kept in run_dir/wandb/ for `wandb sync`.
    config.report_to = "tensorboard"
    config.wandb_project = "mathrl_jax"
    config.wandb_mode = "offline"
    config.export_final = True  # write the final policy to run_dir/final_model (Hugging Face format)
    # JAX's persistent compilation cache (scripts/): "auto" = $JAX_COMPILATION_CACHE_DIR or
    # ~/.cache/mathrl_jax/jax_compilation_cache; "" = off
    config.compilation_cache_dir = "auto"

    # --- scale -----------------------------------------------------------------------------
    # The trainer's mesh. One GPU: the defaults. One host with 8 GPUs: e.g. fsdp=-1 or
    # fsdp=4 tp=2. Several hosts: the same flags, over the devices of all hosts.
    config.mesh = mesh_config()
    # The sampler's mesh: an axis left unset follows the trainer's. E.g. data-parallel
    # decoding beside a tensor-parallel trainer: --config.sampler_mesh.dp=-1
    # --config.sampler_mesh.fsdp=1 --config.sampler_mesh.tp=1.
    config.sampler_mesh = ml_collections.ConfigDict({axis: placeholder(int) for axis in ("dp", "fsdp", "tp")})
    # Several processes (jax.distributed, started by scripts/train.py from JAX_COORDINATOR_ADDRESS /
    # JAX_NUM_PROCESSES / JAX_PROCESS_ID, SLURM or Open MPI): a process lost for this long aborts the others.
    config.heartbeat_timeout_s = 100
    # How long each process waits for all of them to join at start-up (JAX's initialization_timeout); one that
    # refused its config, or never started, aborts the others after this long.
    config.join_timeout_s = 300
    return config
