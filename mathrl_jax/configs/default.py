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
            (
                "The algorithm (train/algorithms.py; docs/training.md): grpo, drgrpo (Dr. GRPO), dapo, gspo "
                '(TRL\'s importance_sampling_level="sequence"; its sequence ratio is clipped at clip_low / '
                "clip_high as TRL's epsilon, so the GSPO paper's is --config.clip_low=3e-4 "
                "--config.clip_high=4e-4), rloo, reinforce_pp (REINFORCE++-baseline), ppo (a critic, GAE), appo "
                "and tppo (OpenR's, a critic over reasoning steps), async_ppo (AReaL's decoupled loss, rollouts "
                "ahead of the trainer), reinforce_rebn (GEM's multi-turn ReBN). Any case; TRL's and verl's "
                "spellings too (Dr_GRPO, ...)."
            ),
            choices="mathrl_jax.train.algorithms:NAMES",
            case_free=True,
        ),
        Option(
            "seed",
            0,
            (
                "Seeds everything drawn: the initial weights of the tiny model, the data's order and held-out "
                "split, the sampler's keys, the minibatch order."
            ),
            low=0,
            high=2**32 - 1,  # numpy's and JAX's seeds: a 32-bit word
        ),
        Option(
            "run_dir",
            "runs/default",
            (
                "The run directory: checkpoints/, metrics.jsonl, config.json, tensorboard events, samples/, "
                "final_model/. The same command again resumes it; each recipe and docs command names its own."
            ),
            resume=MAY_CHANGE,
        ),
        Option(
            "resume",
            True,
            (
                "Continue from the latest intact checkpoint in run_dir/checkpoints if there is one (the same "
                "command again resumes a run); False starts over."
            ),
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
        Option(
            "model_name_or_path",
            "",
            (
                "A local Hugging Face checkpoint directory, or a Hub id (org/name: downloaded into the HF cache, or "
                'read from it when HF_HUB_OFFLINE=1); "" = the tiny offline model (written to run_dir).'
            ),
        ),
        Option(
            "prm_model_name_or_path",
            "",
            (
                "The step rewards' model: a local PRM checkpoint directory, a Hub id (as model_name_or_path), or a "
                'rule-based step verifier ("arithmetic_steps", "countdown_steps"); "" = none.'
            ),
        ),
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
        Option(
            "dtype",
            "float32",
            (
                "The compute dtype of the training passes and the JAX sampler: float32, or bfloat16 at real sizes "
                "(with param_dtype float32: see param_dtype)."
            ),
        ),
        Option(
            "remat",
            False,
            (
                "Rematerialise each decoder layer in the backward pass (jax.checkpoint; gradient checkpointing): "
                "less activation memory, about a third more compute."
            ),
            resume=MAY_CHANGE,
        ),
        Option(
            "remat_policy",
            "nothing_saveable",
            (
                "What remat keeps of each layer's forward for the backward (jax.checkpoint_policies): "
                '"nothing_saveable" (the layer\'s input alone; the whole forward recomputed), '
                '"dots_with_no_batch_dims_saveable" (also the weight matmuls\' outputs: MaxText\'s "minimal"; '
                'recomputes attention and the elementwise ops), "dots_saveable" (every matmul\'s output). More '
                "kept, less recomputed: more memory, fewer FLOPs. Used only with remat=True."
            ),
            resume=MAY_CHANGE,
            choices="mathrl_jax.models.qwen:REMAT_POLICIES",
        ),
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
            ("LoRA adapters (models/lora.py)."),
        ),
        Option(
            "lora.rank",
            0,
            (
                "LoRA (models/lora.py): > 0 trains rank-r adapters on lora.targets with the base frozen (the "
                "optimizer state and checkpoints hold the adapters alone); 0 trains every weight."
            ),
            low=0,
            resume=NEVER,
        ),
        Option(
            "lora.alpha",
            16.0,
            "PEFT's lora_alpha: the adapters' update is scaled by alpha / rank.",
            low=0.0,
            low_open=True,
        ),
        Option(
            "lora.targets",
            "q_proj,v_proj",
            (
                'The projections that get adapters, comma-separated ("q_proj,v_proj" as OpenR; "all-linear" for '
                "every decoder projection)."
            ),
            resume=NEVER,
        ),
        Option(
            "lora.share_critic_base",
            False,
            (
                "True: the critic (PPO family) is the policy's frozen base, adapters off, under OpenR's MLP value "
                "head, which alone trains (value_head.FrozenBaseCritic); False: a critic of its own that trains "
                "every weight."
            ),
            resume=NEVER,
        ),
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
        Option(
            "dataset_name",
            "arithmetic",
            (
                "The task: arithmetic or countdown (built in, no file), a MATH subject (OpenR's prealgebra, ...: "
                "dataset_path's problems of that subject), or the layout of the file at dataset_path: auto (detected "
                "from its fields), math500, math, gsm8k, areal_boba, verl, trl (TRL's: a prompt string or chat "
                "messages with solution / answer / ground_truth), custom (with data.fields). Your own file: start "
                "from configs/own_data.py."
            ),
        ),
        Option(
            "dataset_path",
            "",
            (
                "The training data: a JSONL / JSON / parquet file, a `datasets` directory, or a dataset's Hub id "
                "(org/name; downloaded unless HF_HUB_OFFLINE is set, else read from the local cache). A path that "
                "does not exist is refused as a missing path, never looked up on the Hub."
            ),
        ),
        Option(
            "eval_dataset_path",
            "",
            (
                'The held-out evaluation\'s data (the forms of dataset_path); "" = eval_dataset_split of '
                "dataset_path if named, else eval_holdout problems held out of it."
            ),
            resume=MAY_CHANGE,
        ),
        Option(
            "dataset_split",
            "",
            (
                'The split of a dataset folder or Hub dataset that holds several ("train", "test"); "" '
                "for one that holds one"
            ),
        ),
        Option(
            "eval_dataset_split",
            "",
            (
                "The split of eval_dataset_path (or, with no eval_dataset_path, of dataset_path: a held-out split "
                'of the same dataset, e.g. "test") that the held-out evaluation reads; "" = none named.'
            ),
            resume=MAY_CHANGE,
        ),
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
            ("Your data file's fields."),
        ),
        Option(
            "data.fields",
            "",
            (
                "A mapping from the layout's roles to your file's fields, comma-separated \"ROLE:FIELD\" pairs "
                '("question:problem,answer:gold"); ROLE is question, answer, solution, uid, level or subject. '
                'Given, it defines the layout (dataset_name "auto" or "custom"); "" = the layout\'s own '
                "fields."
            ),
        ),
        Section("arithmetic", 'The offline arithmetic task (dataset_name="arithmetic", data/arithmetic.py).'),
        Option(
            "arithmetic.levels",
            (2,),
            (
                "The arithmetic levels drawn (data/arithmetic.py: 1 = one-digit + -, 2 = two-digit + -, 3 = *, 4 = "
                "three terms with precedence, 5 = four or five terms); the warm-start's teacher knows level 2 only."
            ),
        ),
        Option(
            "arithmetic.num_train",
            8000,
            "Arithmetic training problems (drawn once from the seed; repeats allowed, none a held-out question).",
            low=1,
        ),
        Option(
            "arithmetic.num_eval",
            500,
            "Distinct arithmetic held-out problems (the first num_eval_problems of them are evaluated).",
            low=0,
        ),
        Option(
            "arithmetic.question_format",
            "{expr}=",
            'How an expression becomes the question: "{expr}" is replaced by it ("{expr}=" asks "57-83=").',
        ),
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
            ('The countdown task (dataset_name="countdown", configs/countdown.py).'),
        ),
        Option(
            "countdown.count",
            3,
            (
                'dataset_name="countdown" (configs/countdown.py, data/countdown/): how many numbers each instance '
                'gives (3 to 6); reach the target with + - *, each number used once: "3,7,5->26:" is answered '
                '"7*3=21,21+5=26,\\boxed{26}". The reward is a valid derivation, not the boxed number '
                "(rewards/countdown_grader.py)."
            ),
        ),
        Option("countdown.min_number", 1, "The smallest number of a countdown instance."),
        Option("countdown.max_number", 9, "The largest number of a countdown instance."),
        Option(
            "countdown.max_target",
            99,
            "Countdown targets are drawn from 1 to max_target (among those the numbers reach).",
        ),
        Option("countdown.num_train", 8000, "Countdown training instances (repeats allowed).", low=1),
        Option("countdown.num_eval", 500, "Distinct countdown held-out instances.", low=0),
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
            (
                "How a question becomes the prompt (data/prompts.py): plain (the question), boxed (+ Qwen2.5-Math's "
                "\\boxed{} instruction), verl_boxed (+ verl's), r1_zero (DeepSeek-R1-Zero's template), chat / "
                "chat_plain (the tokenizer's chat template over the boxed / plain question). Chat-message data goes "
                "through the chat template with the instruction of boxed / chat appended to its last user message."
            ),
            choices="mathrl_jax.data.prompts:TEMPLATE_NAMES",
        ),
        Option(
            "max_prompt_length",
            16,
            (
                "The longest prompt in tokens (TRL's and verl's max_prompt_length): a longer one stops the run at "
                "the start, naming the problem (nothing is truncated silently)."
            ),
            low=1,
            high=2**24,
        ),
        Option(
            "num_eval_problems",
            500,
            (
                "How many held-out problems each evaluation scores (200 give about +-3 points of noise on an "
                "accuracy, 500 about +-2); 0 = none."
            ),
            low=0,
            resume=MAY_CHANGE,
        ),
    ),
    *group(
        "rollout",
        Option(
            "sampler",
            "jax",
            (
                'What samples the rollouts: "jax" (the pure-JAX sampler with a KV cache, in this process) or '
                '"vllm" (vLLM\'s engine in this process, over tensor-parallel workers, or a server: the vllm '
                "options; docs/vllm.md). Evaluations use the JAX sampler."
            ),
            resume=MAY_CHANGE,
            choices=("jax", "vllm"),
            case_free=True,
        ),
        Section(
            "jax_sampler",
            ('The pure-JAX sampler (sampler="jax").'),
        ),
        Option(
            "jax_sampler.kv_cache_gib",
            16.0,
            (
                'The JAX sampler (sampler="jax", and every evaluation): the KV cache of one prefill + decode is '
                "bounded by this many GiB; a batch over it runs in sub-batches of prompts (the same samples). An "
                "out-of-memory names it."
            ),
            resume=MAY_CHANGE,
            low=0.0,
            low_open=True,
        ),
        Option(
            "jax_sampler.compact_interval",
            256,
            (
                "Every this many decode steps, the running rows move into a batch a quarter as large once they fit "
                "(the same samples; 0 = never): a long answer's tail stops paying for the rows that have finished."
            ),
            resume=MAY_CHANGE,
            low=0,
        ),
        Option(
            "jax_sampler.lora_sync",
            "merged",
            (
                'A LoRA policy reaches the JAX sampler merged into its kernels at each sync ("merged", the '
                'faster: docs/training.md#lora) or as adapters applied in each projection ("adapter": no kernel '
                "copied)."
            ),
            choices="mathrl_jax.sampling.base:LORA_SYNCS",
        ),
        Section(
            "vllm",
            ('The vLLM engine (sampler="vllm"; docs/vllm.md).'),
        ),
        Option(
            "vllm.kv_cache_gib",
            1.0,
            (
                'The vLLM engine (sampler="vllm"; docs/vllm.md): its KV cache in GiB (host memory on vLLM\'s CPU '
                "build, GPU memory on a GPU); it bounds the tokens in flight, not a request's length. More than the "
                "machine has free stops the run at the start, naming this option."
            ),
            resume=MAY_CHANGE,
            low=0.0,
            low_open=True,
        ),
        Option(
            "vllm.dtype",
            "",
            (
                'The engine\'s weights and compute; "" = dtype (a bfloat16 engine beside a float32 trainer: '
                "consider tis_cap)."
            ),
            resume=MAY_CHANGE,
        ),
        Option(
            "vllm.lora_sync",
            "merged",
            (
                'A LoRA policy reaches vLLM as merged weights ("merged") or as vLLM\'s own LoRA adapters '
                '("adapter": a LoRARequest per sync); docs/training.md#lora says which is faster.'
            ),
            resume=MAY_CHANGE,
            choices="mathrl_jax.sampling.base:LORA_SYNCS",
        ),
        Option(
            "vllm.tensor_parallel_size",
            1,
            (
                "The in-process engine's tensor-parallel workers (> 1: one process each, synced through vLLM's "
                "weight transfer)."
            ),
            resume=MAY_CHANGE,
            low=1,
            high=1024,
        ),
        Option(
            "vllm.server_url",
            "",
            (
                '"" = the engine in this process; "http://host:port" = rollouts from a vLLM server started with '
                "scripts/vllm_server.py (kv_cache_gib, tensor parallel and dtype are then the server's own)."
            ),
            resume=MAY_CHANGE,
        ),
        Option(
            "vllm.timeout_s",
            600.0,
            "The longest one request to a vLLM server may take before the run stops naming it (exit 2).",
            resume=MAY_CHANGE,
            low=0.0,
            low_open=True,
        ),
        Option(
            "vllm.transfer",
            "auto",
            (
                'How weights reach an engine in other processes: "auto" (in-process workers: shared memory; a '
                'server: the engine it was started with), "mathrl_shared_memory" (files in /dev/shm: one host), '
                '"nccl" (a GPU server; not run yet).'
            ),
            resume=MAY_CHANGE,
            choices="mathrl_jax.sampling.vllm.plugin:TRANSFERS",
        ),
        Option(
            "vllm.transfer_chunk_gib",
            1.0,
            "The most one weight-transfer step holds (a file in /dev/shm, NCCL's buffer), in GiB.",
            resume=MAY_CHANGE,
            low=0.0,
            low_open=True,
        ),
        Option(
            "n_rollout_threads",
            32,
            "Prompts per iteration (OpenR's name; verl's data.train_batch_size): each sampled group_size times.",
            low=1,
            high=2**20,
        ),
        Option(
            "group_size",
            8,
            (
                "Completions sampled per prompt (GRPO's G; TRL's num_generations, verl's rollout.n); the group "
                "baselines compare them."
            ),
            low=1,
            high=2**16,
        ),
        Option(
            "episode_length",
            1,
            (
                "Multi-turn environments: the turns an episode may take; step-wise rewards: the steps a response is "
                "cut into."
            ),
            low=1,
            high=2**16,
        ),
        Option(
            "max_new_tokens",
            40,
            (
                "The most tokens a completion may have (TRL's max_completion_length, verl's max_response_length); "
                "one that reaches it without EOS is truncated (rollout/truncated_fraction). The offline default's "
                "40 holds the warm-start's worked solutions (up to 33 tokens with EOS)."
            ),
            low=1,
            high=2**24,
        ),
        Option(
            "temperature",
            1.0,
            (
                "The sampling temperature of rollouts (and of pass@k at the first and last evaluation; greedy "
                "accuracy is temperature 0)."
            ),
            low=0.0,
            low_open=True,
        ),
        Option(
            "top_p",
            1.0,
            (
                "Nucleus sampling: the smallest set of tokens whose probability reaches top_p is kept (1 = off). "
                "The trainer's old log-probs then come from its own pass (old_logprobs=auto)."
            ),
            low=0.0,
            low_open=True,
            high=1.0,
        ),
        Option("top_k", 0, "Only the top_k most likely tokens are kept (0 or -1 = off).", low=-1),
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
        Option(
            "num_iterations",
            40,
            (
                "RL iterations: each samples n_rollout_threads x group_size completions, then makes num_mini_batch "
                "x ppo_epoch optimizer steps on them."
            ),
            resume=MAY_CHANGE,
            low=0,
        ),
        Option(
            "num_env_steps",
            0,
            (
                "OpenR's budget: if > 0, the iterations are num_env_steps / (n_rollout_threads x group_size x "
                "episode_length), in place of num_iterations."
            ),
            resume=MAY_CHANGE,
            low=0,
            high=2**62,
        ),
    ),
    *group(
        "reward",
        Option(
            "reward_source",
            "verifier",
            (
                "What scores a completion: verifier (math-verify of the boxed answer against the gold), prm (a "
                "process reward model's step scores), prm+verifier (PRM step scores on the steps' ends plus the "
                "verifier's at the last), functions (your reward.functions alone), verifier+functions (their "
                "weighted sum added to the verifier's score)."
            ),
            choices=("verifier", "prm", "prm+verifier", "functions", "verifier+functions"),
        ),
        Section("prm", "The process reward model (reward_source prm or prm+verifier)."),
        Option(
            "prm.step_tag",
            "ки",
            (
                'The process reward model\'s step tag: the token after every reasoning step ("ки" for '
                "Math-Shepherd and OpenR's PRMs), where it scores the step."
            ),
        ),
        Option(
            "prm.candidate_tokens",
            ("+", "-"),
            (
                "The PRM's verdict tokens (good, bad, ...), each one token; a step's score is the softmax "
                "probability of the first among them at its tag."
            ),
        ),
        Option(
            "env_name",
            "",
            (
                'A multi-turn environment in place of single-turn problems: "" = none; guess_number = GEM\'s '
                "GuessTheNumber (algorithm_name reinforce_rebn)."
            ),
        ),
        Section(
            "guess_number",
            ('GEM\'s GuessTheNumber-v0 (env_name="guess_number").'),
        ),
        Option(
            "guess_number.min_number",
            1,
            'guess_number (GEM\'s GuessTheNumber-v0, env_name="guess_number"): the smallest secret number.',
        ),
        Option("guess_number.max_number", 20, "guess_number: the largest secret number."),
        Option("guess_number.max_turns", 20, "guess_number: the turns a game may take (GEM's default budget)."),
        Section(
            "reward",
            ("The verifier's reward values and your own reward functions."),
        ),
        Option(
            "reward.correct",
            1.0,
            "The verifier's reward of a correct final answer (math-verify against the gold answer; RLinf uses 5).",
        ),
        Option("reward.incorrect", 0.0, "The verifier's reward of a wrong final answer (RLinf uses -5)."),
        Option(
            "reward.no_answer",
            0.0,
            "The verifier's reward of a response with no final answer at all (no \\boxed{} nor a fallback answer).",
        ),
        Option(
            "reward.format_reward",
            0.0,
            "Added to the verifier's reward when the response has a non-empty \\boxed{} answer (a format bonus).",
        ),
        Option(
            "reward.timeout_s",
            5.0,
            (
                "The longest one math-verify comparison may take (seconds): past it the answer counts as incorrect "
                "and the worker is killed."
            ),
            low=0.0,
            low_open=True,
        ),
        Option(
            "reward.num_workers",
            2,
            "Processes grading answers with math-verify in parallel (each killable at reward.timeout_s).",
            low=1,
            resume=MAY_CHANGE,
            high=1024,
        ),
        Option(
            "reward.functions",
            "",
            (
                'Your own reward functions (reward_source "functions" or "verifier+functions"), '
                'comma-separated "module:function" or "path/to/file.py:function", called as TRL calls its '
                "reward_funcs (prompts, completions, completion_ids, trainer_state, and the problem's question, "
                "answer (also as solution and ground_truth: the gold answer), worked_solution, level, subject, "
                "uid; chat-message data in TRL's conversational shape; rewards/functions.py). Each result must "
                "be one number (or None) per completion, finite in float32, else the run stops naming the "
                "function and value."
            ),
        ),
        Option(
            "reward.weights",
            "",
            (
                'One weight per reward function, comma-separated ("" = 1 each): the reward is their weighted sum '
                "(TRL's reward_weights)."
            ),
        ),
        Option(
            "reward.function_timeout_s",
            60.0,
            (
                "The longest one call of a reward function may take (seconds): each runs in a process of its own, "
                "killed at the limit, and the run stops naming it (exit 2)."
            ),
            low=0.0,
            low_open=True,
            resume=MAY_CHANGE,
        ),
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
        Option(
            "ppo_epoch",
            1,
            (
                "Passes over each batch (TRL's num_iterations, verl's ppo_epochs): > 1 reuses the samples, the "
                "clipped ratio keeping the policy near them."
            ),
            low=1,
        ),
        Option(
            "num_mini_batch",
            4,
            (
                "Optimizer steps per pass over a batch: the batch is split into this many minibatches (verl: "
                "train_batch_size / ppo_mini_batch_size)."
            ),
            low=1,
        ),
        Option(
            "micro_batch_size",
            0,
            (
                "Rows per forward / backward pass, their gradients summed into the minibatch's one step (gradient "
                "accumulation); 0 = sized from micro_batch_gib (the whole minibatch in one pass where it fits)."
            ),
            resume=MAY_CHANGE,
            low=0,
        ),
        Option(
            "micro_batch_gib",
            4.0,
            (
                "With micro_batch_size 0: the activation memory one forward / backward pass may take, estimated "
                "from the model's shape at the longest row (max_prompt_length + max_new_tokens); a minibatch over "
                "it runs in micro-batches of the most rows within it (the same step; said on stderr). The rows "
                "depend on the config, not on the machine's memory."
            ),
            resume=MAY_CHANGE,
            low=0.0,
            low_open=True,
        ),
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
            "With packing: the tokens of one packed row; at least the batch width (the longest prompt + completion).",
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
                "The policy's learning rate (TRL's learning_rate). Small: RL starts a fresh Adam on a "
                "warm-started policy, and Adam's first steps move every weight by about lr: 1e-4 already makes "
                "the offline default's held-out accuracy swing by 10 points between evaluations."
            ),
            low=0.0,
            low_open=True,
        ),
        Option("critic_lr", 0.001, "The critic's learning rate (PPO, APPO, TPPO).", low=0.0, low_open=True),
        Option(
            "lr_schedule",
            "constant",
            (
                "The policy's learning rate after warm-up: constant, linear (to 0 at the last step) or cosine "
                "(TRL's lr_scheduler_type)."
            ),
            choices="mathrl_jax.train.state:SCHEDULES",
        ),
        Option("warmup_steps", 10, "Optimizer steps of linear learning-rate warm-up from 0 (then lr_schedule).", low=0),
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
        Option("weight_decay", 0.0, "AdamW's decoupled weight decay.", low=0.0),
        Option(
            "max_grad_norm",
            1.0,
            "Gradients are clipped to this global norm (optax.clip_by_global_norm; verl's grad_clip).",
            low=0.0,
            low_open=True,
        ),
        Option("adam_eps", 1e-8, "AdamW's epsilon (OpenR uses 1e-5).", low=0.0, low_open=True),
        Option(
            "clip_low",
            0.2,
            (
                "The PPO ratio clip below: the ratio is kept in [1 - clip_low, 1 + clip_high] (TRL's epsilon, "
                "verl's clip_ratio_low)."
            ),
            low=0.0,
            high=1.0,
        ),
        Option(
            "clip_high",
            None,
            (
                "The PPO ratio clip above (1 + clip_high; TRL's epsilon_high, verl's clip_ratio_high; DAPO's "
                "clip-higher: 0.28); None = clip_low."
            ),
            value_type=float,
            low=0.0,
        ),
        Option(
            "clip_c",
            None,
            (
                "The dual clip of token-level PPO (verl's clip_ratio_c, e.g. 3): a negative advantage's loss is "
                "bounded by clip_c x |A|; None = off."
            ),
            value_type=float,
            low=1.0,
            low_open=True,
        ),
        Option(
            "loss_agg_mode",
            "token-mean",
            (
                "How token losses become one number (losses/aggregate.py): token-mean (DAPO; TRL's dapo and bnpo), "
                "seq-mean-token-mean (GRPO; TRL's grpo), seq-mean-token-sum, seq-mean-token-sum-norm (Dr. GRPO; "
                "TRL's dr_grpo, over max_new_tokens). TRL's names are taken as these values."
            ),
            choices="mathrl_jax.losses.aggregate:LOSS_AGG_MODE_NAMES",
        ),
        Option(
            "mask_truncated_completions",
            False,
            (
                "TRL's mask_truncated_completions (DAPO's overlong filtering): a completion cut at max_new_tokens "
                "(no EOS) trains nothing: its tokens leave the loss; it still counts in its group's statistics."
            ),
        ),
        Option(
            "entropy_coef",
            0.0,
            (
                "The entropy bonus: entropy_coef x the policy's mean token entropy is subtracted from the loss "
                "(verl's entropy_coeff)."
            ),
        ),
        Option(
            "kl_coef",
            0.0,
            (
                "The KL loss to the reference model: this coefficient times the kl_kind estimate is added to the "
                "policy loss (TRL's beta, verl's kl_loss_coef); 0 = no reference model."
            ),
            low=0.0,
        ),
        Option(
            "kl_kind",
            "k3",
            (
                "The KL estimator of the KL loss against the reference model: k1, k2 (mse), k3 (low_var_kl, TRL's "
                "and GRPO's), abs."
            ),
            choices="mathrl_jax.losses.kl:KL_KINDS",
            case_free=True,
        ),
        Option(
            "kl_reward_coef",
            0.0,
            (
                "The KL penalty in the reward (PPO family, verl's algorithm.kl_ctrl.kl_coef): each token's reward "
                "loses this times its KL to the reference; 0 = off."
            ),
            low=0.0,
        ),
        Option("gamma", 1.0, "The discount of GAE (PPO family) and of multi-turn returns.", low=0.0, high=1.0),
        Option("lam", 0.95, "GAE's lambda.", low=0.0, high=1.0),
        Option(
            "target_kl",
            None,
            (
                "OpenR's early stop: a minibatch whose approximate KL to the old policy exceeds it skips its policy "
                "step (OpenR uses 0.02); None = off."
            ),
            value_type=float,
            low=0.0,
            low_open=True,
        ),
        Option(
            "step_separator",
            "\n",
            (
                "Where a response's reasoning steps end (APPO and TPPO's actions, PRM step scores): after each "
                "occurrence of this text in the tokens."
            ),
        ),
        Option(
            "appo_action_ratio",
            True,
            (
                "appo: one importance ratio per action (a reasoning step, as OpenR); False: one per token, with the "
                "step's advantage on each."
            ),
        ),
        Option(
            "advantage_whitening",
            "batch",
            (
                'How advantages are standardised: "batch" over the batch\'s tokens (verl), "openr" per minibatch '
                "as OpenR (APPO: over its actions; TPPO: over its non-zero token advantages)."
            ),
            choices=("batch", "openr"),
        ),
        Option(
            "value_loss_type",
            "mse",
            "The critic's loss: mse, huber, or huber_one_sided (OpenR's `huber_loss`: no loss below -huber_delta).",
            choices="mathrl_jax.losses.value:VALUE_LOSS_TYPES",
        ),
        Option(
            "huber_delta",
            10.0,
            'The Huber value losses\' delta (value_loss_type "huber" / "huber_one_sided", OpenR\'s 10).',
            low=0.0,
            low_open=True,
        ),
        Option(
            "value_clip",
            0.2,
            (
                "The critic's value clip (PPO's clipped value loss; OpenR's clip_param, verl's cliprange_value); "
                "None = unclipped."
            ),
            low=0.0,
        ),
        Section("dapo", 'DAPO\'s reward shaping (algorithm_name="dapo").'),
        Option(
            "dapo.success_rate_lb",
            0.0,
            (
                "DAPO's dynamic sampling: a group trains only if its success rate is strictly above this (0: drop "
                "the all-wrong groups)."
            ),
            low=0.0,
            high=1.0,
        ),
        Option(
            "dapo.success_rate_ub",
            1.0,
            (
                "DAPO's dynamic sampling: a group trains only if its success rate is strictly below this (1: drop "
                "the all-right groups)."
            ),
            low=0.0,
            high=1.0,
        ),
        Option(
            "dapo.overlong_buffer_len",
            0,
            (
                "DAPO's soft overlong punishment: a response within this many tokens of max_new_tokens loses up to "
                "overlong_penalty_factor of reward, linearly (0 = off)."
            ),
            low=0,
        ),
        Option(
            "dapo.overlong_penalty_factor",
            1.0,
            "DAPO's soft overlong punishment: the reward lost by a response at max_new_tokens.",
            low=0.0,
        ),
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
        Option(
            "behaviour_weight_cap",
            None,
            (
                "AReaL's decoupled loss: tokens whose behaviour importance weight (proximal over behaviour policy) "
                "exceeds it leave the loss; None keeps all."
            ),
            value_type=float,
            low=0.0,
            low_open=True,
        ),
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
            ("The supervised warm-start before RL."),
        ),
        Option(
            "warmstart.steps",
            1200,
            (
                "Supervised warm-start steps before RL, in the same command (0 = none): the model imitates "
                "warmstart.targets."
            ),
            low=0,
        ),
        Option("warmstart.batch_size", 32, "The warm-start's batch size (sequences per step).", low=1),
        Option("warmstart.lr", 0.001, "The warm-start's learning rate.", low=0.0, low_open=True),
        Option("warmstart.warmup_steps", 50, "The warm-start's linear learning-rate warm-up steps.", low=0),
        Option(
            "warmstart.targets",
            "teacher",
            (
                '"teacher" = worked solutions from a teacher that slips with probability slip_rate (arithmetic '
                "level 2: data/teacher.py drops the carry / borrow; countdown: data/countdown/teacher.py; "
                'guess_number: binary search whose guess slips to the smallest candidate); "answer" = the bare '
                '"\\boxed{answer}" (not for countdown, whose gold answer is the instance).'
            ),
            choices=("teacher", "answer"),
        ),
        Option(
            "warmstart.slip_rate",
            0.7,
            "How often the warm-start's teacher slips (0 = a perfect teacher; 0.7 leaves RL something to find).",
            low=0.0,
            high=1.0,
        ),
    ),
    *group(
        "logging, evaluation, checkpoints",
        Option(
            "log_interval",
            1,
            "Log an iteration's metrics every this many iterations (evaluations are always logged).",
            resume=MAY_CHANGE,
            low=1,
        ),
        Option(
            "eval_interval",
            10,
            (
                "Greedy held-out evaluation every this many iterations, at the start and at the last iteration (0 = "
                "never)."
            ),
            resume=MAY_CHANGE,
            low=0,
        ),
        Option(
            "eval_n_samples",
            8,
            (
                "At the first and last evaluation, also sample this many completions per held-out problem at the "
                "rollout temperature: pass@1 (the sampled accuracy) to pass@k; 0 = greedy only."
            ),
            resume=MAY_CHANGE,
            low=0,
        ),
        Option(
            "num_logged_samples",
            8,
            "Held-out prompts written with their completions to run_dir/samples/ at each evaluation.",
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
        Option(
            "save_interval",
            20,
            "A checkpoint every this many iterations, and at the last one (0 = at the last one only).",
            resume=MAY_CHANGE,
            low=0,
        ),
        Option(
            "max_to_keep",
            2,
            "Checkpoint steps kept in run_dir/checkpoints (TRL's save_total_limit).",
            low=1,
            resume=MAY_CHANGE,
        ),
        Option(
            "progress", True, "Show a progress bar on stderr (the metrics are logged either way).", resume=MAY_CHANGE
        ),
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
        Option("wandb_project", "mathrl_jax", "The wandb project (report_to includes wandb).", resume=MAY_CHANGE),
        Option(
            "wandb_mode",
            "offline",
            '"offline" writes wandb\'s files to run_dir/wandb (wandb sync uploads them); "online" uploads as it runs.',
            resume=MAY_CHANGE,
            choices=("offline", "online"),
        ),
        Option(
            "export_final",
            True,
            (
                "Write the final policy to run_dir/final_model in Hugging Face format (a LoRA run: merged, and its "
                "adapters to run_dir/final_adapter)."
            ),
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
            ("The trainer's device mesh (dp x fsdp x tp)."),
        ),
        Option(
            "mesh.dp",
            1,
            (
                "The trainer's mesh (one GPU: the defaults; 8 GPUs: e.g. fsdp=-1, or fsdp=4 tp=2; several hosts: "
                "the same flags over all hosts' devices): data-parallel replicas (-1 = the devices left)."
            ),
            resume=MAY_CHANGE,
        ),
        Option(
            "mesh.fsdp",
            -1,
            (
                "The trainer's mesh: the axis the weights and optimizer state are sharded over (FSDP / ZeRO-3; -1 = "
                "the devices left)."
            ),
            resume=MAY_CHANGE,
        ),
        Option(
            "mesh.tp",
            1,
            "The trainer's mesh: tensor parallelism (Megatron-style column / row splits; -1 = the devices left).",
            resume=MAY_CHANGE,
        ),
        Section(
            "sampler_mesh",
            ("The sampler's device mesh (an axis left unset follows the trainer's)."),
        ),
        Option(
            "sampler_mesh.dp",
            None,
            (
                "The sampler's mesh: data-parallel decoding (None = the trainer's mesh.dp). E.g. beside a "
                "tensor-parallel trainer: sampler_mesh.dp=-1 sampler_mesh.fsdp=1 sampler_mesh.tp=1."
            ),
            value_type=int,
            resume=MAY_CHANGE,
        ),
        Option(
            "sampler_mesh.fsdp",
            None,
            "The sampler's mesh: its fsdp axis (None = the trainer's).",
            value_type=int,
            resume=MAY_CHANGE,
        ),
        Option(
            "sampler_mesh.tp",
            None,
            "The sampler's mesh: its tensor-parallel axis (None = the trainer's).",
            value_type=int,
            resume=MAY_CHANGE,
        ),
    ),
)


def get_config():
    """The default config: every option of `OPTIONS` at its default."""
    return config_from(OPTIONS)
