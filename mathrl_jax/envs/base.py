"""The GEM-style environment API, a vectorised runner and the episode loop.

An `Env` is a text MDP with Gymnasium's signatures, as GEM defines them
(axon-rl/gem `gem/core.py`):

    observation, info = env.reset(seed)
    observation, reward, terminated, truncated, info = env.step(action)

Observations and actions are strings. `terminated` means the task's MDP reached a
terminal state (answered, won, lost); `truncated` means it was cut off from
outside the MDP (a turn limit). After either, the env must be reset.

`VectorEnv` steps many envs in lock step; envs that finished are passed `None`
and left alone. `run_episodes` plays a batch of episodes with a policy that sees
each running episode's history.
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

TERMINAL_STATE = "<｜TERMINAL_STATE｜>"
"""GEM's observation after a step that ends the episode with nothing to show (gem/utils/constants.py)."""

StepResult = tuple[str, float, bool, bool, dict[str, Any]]


class Env(abc.ABC):
    """A text environment: `reset(seed) -> (observation, info)`, `step(action) -> (obs, reward, terminated,
    truncated, info)`."""

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Starts an episode; the same seed gives the same episode."""

    @abc.abstractmethod
    def step(self, action: str) -> StepResult:
        """Applies one action (the policy's text) and returns the transition."""

    @classmethod
    def step_many(cls, envs: Sequence[Env], actions: Sequence[str]) -> list[StepResult]:
        """Steps several envs of this class at once; override to batch work (e.g. one PRM call for all)."""
        return [env.step(action) for env, action in zip(envs, actions)]

    def close(self) -> None:
        """Releases resources; the default has none."""


def check_seed(seed: int | None) -> int | None:
    """A seed is None or a non-negative int (as GEM's `seeding.np_random`); anything else raises, naming it."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be None or a non-negative int, got {seed!r}")
    return int(seed)


def check_action(action: Any) -> str:
    if not isinstance(action, str):
        raise TypeError(f"an action must be a str (the policy's text), got {type(action).__name__}: {action!r:.80}")
    return action


@dataclasses.dataclass
class Episode:
    """One env's trajectory: o_0 a_0 r_0 o_1 a_1 r_1 ... (`observations` has one more entry than `actions`).

    Attributes:
      observations: o_0 (from reset), o_1, ... (o_{t+1} is what step t returned).
      actions: a_0, a_1, ...
      rewards: r_0, r_1, ... (reward of step t).
      terminated, truncated: how the episode ended (both False while it runs).
      infos: info of reset, then of every step (one more entry than `actions`).
    """

    observations: list[str]
    actions: list[str] = dataclasses.field(default_factory=list)
    rewards: list[float] = dataclasses.field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    infos: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def total_reward(self) -> float:
        return float(sum(self.rewards))

    @property
    def num_turns(self) -> int:
        return len(self.actions)


class VectorEnv:
    """Many envs stepped in lock step (GEM's SyncVectorEnv, without autoreset).

    `step(actions)` takes one action per env; an env whose episode has ended must
    get `None` and is left alone: its reward is 0 and it stays done. Envs of one
    class are stepped together through `Env.step_many` (so a class can batch them);
    with `max_workers > 1`, classes are stepped in parallel threads (for envs that
    wait on processes, like the sandbox or the grader).
    """

    def __init__(self, env_fns: Sequence[Callable[[], Env]], *, max_workers: int = 1):
        if isinstance(env_fns, Env) or not isinstance(env_fns, Sequence) or len(env_fns) == 0:
            raise ValueError(f"env_fns must be a non-empty sequence of env factories, got {env_fns!r:.80}")
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"max_workers must be a positive int, got {max_workers!r}")
        envs = []
        for i, fn in enumerate(env_fns):
            if not callable(fn):
                raise TypeError(f"env_fns[{i}] must be a callable returning an Env, got {fn!r:.80}")
            env = fn()
            if not isinstance(env, Env):
                raise TypeError(f"env_fns[{i}]() returned {type(env).__name__}, not an Env")
            envs.append(env)
        self.envs: list[Env] = envs
        self.num_envs = len(envs)
        self.max_workers = max_workers
        self._done = np.ones(self.num_envs, bool)  # nothing runs before reset
        self._ended = np.zeros((self.num_envs, 2), bool)  # (terminated, truncated) of finished episodes

    @property
    def done(self) -> np.ndarray:
        """`[num_envs]` bool: which envs have no running episode."""
        return self._done.copy()

    def reset(self, seeds: Sequence[int | None]) -> tuple[list[str], list[dict[str, Any]]]:
        """Resets every env, env i with `seeds[i]`."""
        seeds = self._per_env(seeds, "seeds")
        observations, infos = [], []
        for env, seed in zip(self.envs, seeds):
            observation, info = env.reset(seed=check_seed(seed))
            observations.append(observation)
            infos.append(info)
        self._done[:] = False
        self._ended[:] = False
        return observations, infos

    def step(
        self, actions: Sequence[str | None]
    ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """One step of every running env.

        Returns (observations, `[N]` float64 rewards, `[N]` bool terminated, `[N]` bool
        truncated, infos). A finished env (given None) returns "", reward 0, its final
        terminated / truncated flags, and an empty info.
        """
        actions = self._per_env(actions, "actions")
        groups: dict[type, list[int]] = {}
        for i, action in enumerate(actions):
            if self._done[i]:
                if action is not None:
                    raise ValueError(
                        f"env {i} has no running episode (reset it, or pass None), got action {action!r:.80}"
                    )
                continue
            if action is None:
                raise ValueError(f"env {i} is running and needs an action, got None")
            check_action(action)
            groups.setdefault(type(self.envs[i]), []).append(i)

        def run(cls, indices):
            return indices, cls.step_many([self.envs[i] for i in indices], [actions[i] for i in indices])

        if self.max_workers > 1 and len(groups) > 1:
            with concurrent.futures.ThreadPoolExecutor(min(self.max_workers, len(groups))) as pool:
                outcomes = list(pool.map(lambda item: run(*item), groups.items()))
        else:
            outcomes = [run(cls, indices) for cls, indices in groups.items()]
        observations = [""] * self.num_envs
        rewards = np.zeros(self.num_envs, np.float64)  # exact: Episode.rewards keep the env's floats
        terminated = self._ended[:, 0].copy()
        truncated = self._ended[:, 1].copy()
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for indices, results in outcomes:
            if len(results) != len(indices):
                raise RuntimeError(f"step_many returned {len(results)} results for {len(indices)} envs")
            for i, (observation, reward, term, trunc, info) in zip(indices, results):
                observations[i], rewards[i], infos[i] = observation, float(reward), info
                terminated[i], truncated[i] = bool(term), bool(trunc)
                if term or trunc:
                    self._done[i] = True
                    self._ended[i] = (bool(term), bool(trunc))
        return observations, rewards, terminated, truncated, infos

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def _per_env(self, values, name):
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise TypeError(f"{name} must be a sequence with one entry per env, got {type(values).__name__}")
        if len(values) != self.num_envs:
            raise ValueError(f"{name} has {len(values)} entries for {self.num_envs} envs")
        return list(values)


Policy = Callable[[list[Episode]], Sequence[str]]
"""Gets the running episodes (history so far, last observation included) and returns one action each."""


def run_episodes(
    vector_env: VectorEnv,
    policy: Policy,
    seeds: Sequence[int | None],
    max_turns: int,
) -> list[Episode]:
    """Plays one episode in every env of `vector_env`, at most `max_turns` steps each.

    Each turn, `policy` is called once with the episodes still running (in env
    order) and returns their actions. An episode still running after `max_turns`
    steps is marked truncated.
    """
    if not isinstance(vector_env, VectorEnv):
        raise TypeError(f"vector_env must be a VectorEnv, got {type(vector_env).__name__}")
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be a positive int, got {max_turns!r}")
    observations, infos = vector_env.reset(seeds)
    episodes = [Episode(observations=[o], infos=[info]) for o, info in zip(observations, infos)]
    for _ in range(max_turns):
        running = [i for i, episode in enumerate(episodes) if not episode.done]
        if not running:
            break
        actions = policy([episodes[i] for i in running])
        if isinstance(actions, str) or len(actions) != len(running):
            raise ValueError(
                f"the policy must return one action per running episode ({len(running)}), got {actions!r:.80}"
            )
        full: list[str | None] = [None] * vector_env.num_envs
        for i, action in zip(running, actions):
            full[i] = check_action(action)
        observations, rewards, terminated, truncated, infos = vector_env.step(full)
        for i in running:
            episode = episodes[i]
            episode.actions.append(full[i])
            episode.observations.append(observations[i])
            episode.rewards.append(float(rewards[i]))
            episode.infos.append(infos[i])
            episode.terminated, episode.truncated = bool(terminated[i]), bool(truncated[i])
    for episode in episodes:
        if not episode.done:
            episode.truncated = True
    return episodes
