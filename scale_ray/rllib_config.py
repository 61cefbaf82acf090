"""A train config as an RLlib AlgorithmConfig (new API stack): PPO with the SRR learner, DQN or
SAC, the env, the RL module of the network, the episode-metrics callback.

Scale-out uses RLlib's own knobs (``learners`` and ``rollout`` sections): env runner actors with
``rollout.num_cpus_per_env_runner`` CPUs each, and ``learners.num_learners`` learner actors
(0: one learner in the driver) with ``num_gpus_per_learner`` / ``num_cpus_per_learner`` each.
``ppo.steps_per_iteration`` (and the DQN/SAC train batch) stays the whole batch of an iteration;
each learner trains on its share.

RLlib, the gym adapter and the RL modules are imported when a config is built.
"""

from __future__ import annotations

import math

from envs.config import ConfigError, EnvConfig, to_dict
from envs.encoding import SERVER_DIM, TASK_DIM, encoder_dims

from .train_config import TrainConfig, cosine_lr
from .train_metrics import COMPLETED_KEY, INVALID_KEY, RESPONSE_KEY


def _episode_metrics_callback():
    from ray.rllib.callbacks.callbacks import RLlibCallback

    class EpisodeMetricsCallback(RLlibCallback):
        """Logs the simulator's episode metrics (final step's info["episode_metrics"])."""

        def on_episode_end(self, *, episode, metrics_logger=None, **kwargs) -> None:
            if metrics_logger is None:
                return
            try:
                info = episode.get_infos(-1)
            except (IndexError, KeyError, AttributeError):
                return
            m = (info or {}).get("episode_metrics")
            if not m:
                return
            for key, src in ((RESPONSE_KEY, "mean_task_response_s"), (COMPLETED_KEY, "completed_tasks"),
                             (INVALID_KEY, "invalid_rate")):
                v = m.get(src)
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    metrics_logger.log_value(key, float(v), window=20)

    return EpisodeMetricsCallback


def build_algo_config(cfg: TrainConfig, env: EnvConfig, total_iterations: int | None = None):
    """The RLlib AlgorithmConfig of a train config (new API stack)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from policies.rl_modules import MODULES

    from envs.gym_env import register_rllib

    env_name = register_rllib()
    env_config = {**to_dict(env), "seed": cfg.run.seed}
    iterations = total_iterations or cfg.run.iterations
    ro = cfg.rollout
    n_envs = max(1, ro.num_env_runners) * ro.num_envs_per_env_runner
    frag = ro.rollout_fragment_length or max(1, cfg.steps_per_iteration // n_envs)
    model_cfg = {"network": cfg.network, **to_dict(cfg.model)}
    # the embeddings' input widths follow the env's observation (features.backlog: 7; nodes)
    width, server_width = encoder_dims(env.encoder, env.features)
    if cfg.model.task_features not in (TASK_DIM, width):
        raise ConfigError(f"model.task_features: {cfg.model.task_features} does not match the "
                          f"env's task features ({width}); leave it out, it is set from the env")
    if cfg.model.server_features not in (SERVER_DIM, server_width):
        raise ConfigError(f"model.server_features: {cfg.model.server_features} does not match "
                          f"the env's server features ({server_width}); leave it out, it is "
                          "set from the env")
    model_cfg["task_features"] = width
    model_cfg["server_features"] = server_width
    ac = _ALGORITHMS[cfg.algorithm](cfg, iterations, model_cfg,
                                    _per_learner(max(1, cfg.learners.num_learners)))
    ac = (ac.environment(env_name, env_config=env_config)
          .env_runners(num_env_runners=ro.num_env_runners,
                       num_envs_per_env_runner=ro.num_envs_per_env_runner,
                       num_cpus_per_env_runner=ro.num_cpus_per_env_runner,
                       rollout_fragment_length=frag)
          .rl_module(rl_module_spec=RLModuleSpec(module_class=MODULES[cfg.algorithm],
                                                 model_config=model_cfg))
          .callbacks(_episode_metrics_callback())
          .reporting(metrics_num_episodes_for_smoothing=cfg.run.metrics_window)
          .fault_tolerance(restart_failed_env_runners=False)  # fail fast, never hang
          .debugging(seed=cfg.run.seed, log_level="WARN")
          .framework("torch"))
    lr_ = cfg.learners
    ac = ac.learners(num_learners=lr_.num_learners, num_gpus_per_learner=lr_.num_gpus_per_learner,
                     num_cpus_per_learner=("auto" if lr_.num_cpus_per_learner is None
                                           else lr_.num_cpus_per_learner))
    return ac


def _per_learner(k: int):
    def per_learner(total: int, key: str) -> int:
        """Each learner's share of a batch of ``total`` (the config keeps the whole batch)."""
        if total % k or total // k < 2:
            raise ConfigError(f"{key}: {total} is not divisible into learners.num_learners = {k} "
                              f"equal shares of at least 2; allowed: a multiple of {k}")
        return total // k
    return per_learner


def _ppo(cfg: TrainConfig, iterations: int, model_cfg: dict, per_learner):
    """PPO with the SRR learner (``cfg.ppo``, ``cfg.srr``)."""
    from ray.rllib.algorithms.ppo import PPOConfig

    from policies.learner import SrrPPOLearner

    p = cfg.ppo
    lr = (cosine_lr(p.lr, p.lr_final, iterations * p.steps_per_iteration, p.lr_points)
          if p.lr_schedule == "cosine" else p.lr)
    return (PPOConfig()
            .training(lr=lr, gamma=p.gamma, lambda_=p.lambda_, clip_param=p.clip_param,
                      entropy_coeff=p.entropy_coeff, vf_loss_coeff=p.vf_loss_coeff,
                      vf_clip_param=p.vf_clip_param, grad_clip=p.grad_clip,
                      grad_clip_by="global_norm", use_kl_loss=False,
                      train_batch_size_per_learner=per_learner(p.steps_per_iteration,
                                                               "ppo.steps_per_iteration"),
                      minibatch_size=p.minibatch_size, num_epochs=p.num_epochs)
            .learners(learner_class=SrrPPOLearner, learner_config_dict={"srr": to_dict(cfg.srr)}))


def _dqn(cfg: TrainConfig, iterations: int, model_cfg: dict, per_learner):
    """Double dueling DQN with prioritized replay (``cfg.dqn``)."""
    from ray.rllib.algorithms.dqn import DQNConfig

    q = cfg.dqn
    model_cfg.update(dueling=True, double_q=True, num_atoms=1,
                     epsilon=[[0, q.epsilon_start], [q.epsilon_steps, q.epsilon_end]])
    return (DQNConfig()
            .training(lr=q.lr, gamma=q.gamma,
                      train_batch_size_per_learner=per_learner(q.train_batch_size,
                                                               "dqn.train_batch_size"),
                      replay_buffer_config=_prioritized_replay(q.replay_capacity),
                      num_steps_sampled_before_learning_starts=(
                          q.num_steps_sampled_before_learning_starts),
                      target_network_update_freq=q.target_network_update_freq,
                      double_q=True, dueling=True, n_step=1, grad_clip=q.grad_clip,
                      grad_clip_by="global_norm", training_intensity=q.training_intensity,
                      epsilon=[[0, q.epsilon_start], [q.epsilon_steps, q.epsilon_end]])
            .reporting(min_sample_timesteps_per_iteration=q.steps_per_iteration))


def _sac(cfg: TrainConfig, iterations: int, model_cfg: dict, per_learner):
    """Discrete SAC with twin Q networks (``cfg.sac``)."""
    from ray.rllib.algorithms.sac import SACConfig

    s = cfg.sac
    model_cfg.update(twin_q=True)
    return (SACConfig()
            .training(actor_lr=s.actor_lr, critic_lr=s.critic_lr, alpha_lr=s.alpha_lr,
                      gamma=s.gamma, tau=s.tau, initial_alpha=s.initial_alpha,
                      target_entropy=s.target_entropy, twin_q=True,
                      train_batch_size_per_learner=per_learner(s.train_batch_size,
                                                               "sac.train_batch_size"),
                      replay_buffer_config=_prioritized_replay(s.replay_capacity),
                      num_steps_sampled_before_learning_starts=(
                          s.num_steps_sampled_before_learning_starts),
                      grad_clip=s.grad_clip, grad_clip_by="global_norm", n_step=1,
                      training_intensity=s.training_intensity)
            .reporting(min_sample_timesteps_per_iteration=s.steps_per_iteration))


def _prioritized_replay(capacity: int) -> dict:
    return {"type": "PrioritizedEpisodeReplayBuffer", "capacity": capacity,
            "alpha": 0.6, "beta": 0.4}


_ALGORITHMS = {"ppo": _ppo, "dqn": _dqn, "sac": _sac}
