"""Supervised fine-tuning before RL: `warm_start` (the teacher's solutions, trained, checked on held-out
problems) and the SFT step it runs.

Behind the door: `_warmstart` (the phase and its record), `_sft` (the supervised loop).
"""

from mathrl_jax.train.warmstart._sft import supervised_warmstart
from mathrl_jax.train.warmstart._warmstart import WarmStartSettings, warm_start, warmstart_examples

__all__ = ["WarmStartSettings", "supervised_warmstart", "warm_start", "warmstart_examples"]
