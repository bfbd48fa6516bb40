"""Co-training: sub-agents on LoRA adapters of the policy's base model learn in the same run as the policy.

A sub-agent entry with `adapter: NAME` and `train: true` is a role: a policy of its own, one LoRA adapter on
the one base model. The policy (TRL's adapter, `default`) is the role `policy`. Per step:

- Samples: every child trajectory a trained sub-agent wrote under the step's trajectories (at any depth),
  with its token ids and loss mask (its model tokens; all zero when a budget cut it and the run masks
  truncated completions).
- Reward: shared. A child's reward is the weighted reward of the root trajectory it served, plus its role's
  own rewards when the sub-agent's entry names some (`rewards:`, scoring the child on its sub-task row). A role
  reward that gives None for a child counts as that reward's mean over the child's group, as a policy reward's
  None does (`agentic_grpo.advantages`).
- Groups: a role's group is every call it answered under the G samples of one query (a parent that called
  it twice gives two samples). Advantage = (reward - group mean) / (group std + 1e-4), with TRL's
  `scale_rewards` (`group`, `batch`: std over all the role's samples, `none`: no division). A group of one
  sample, or of equal rewards (`advantages.all_equal`), has advantage 0 exactly. Groups are formed over every
  process (the rewards are gathered), as TRL does.
- Loss: in each micro-batch, the children of that micro-batch's rows, with the role's adapter active: TRL's own
  loss, the policy's, on a batch of the children (`role_loss`, where the scaling of a share is). In one process
  without DeepSpeed, each child's share is back-propagated on its own, before the policy's forward, so one
  child's graph at a time is alive (the same gradients as the summed loss, less memory). A forward under one
  adapter builds the graph of that adapter's parameters alone, so each role's loss moves its own adapter and
  nothing else.
- Optimizer: one parameter group per role (its `learning_rate`, or the run's), see `role_param_groups`.
- Metrics: `roles/<name>/reward`, `/samples` (at generation), `/loss`, and what TRL's loss logs (`/kl`,
  `/entropy`, `/clip_ratio/...`), per micro-batch, averaged by TRL.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from accelerate.utils import DistributedType, gather_object

from agentic_grpo.advantages import all_equal
from agentic_grpo.canaries import CanaryError, canary_limit, likely_causes, logprob_agreement, sampler_disagreement
from agentic_grpo.experimental.role_loss import LOSS_TYPES, ChildSample, completion_tensor, padded, role_loss
from agentic_grpo.reward_setup import score_trajectories
from agentic_grpo.subagents.adapters import adapter_active
from agentic_grpo.subagents.usage import descendants
from agentic_grpo.trajectory import masked_loss_mask

POLICY_ROLE = "policy"
"""The role name of the trained policy itself (the orchestrator), in `roles/<name>/...` metrics."""


@dataclass(frozen=True)
class Role:
    """A trained sub-agent: its name (the tool's), its adapter, its learning rate (None: the run's) and rewards."""

    name: str
    adapter: str
    learning_rate: float | None = None
    rewards: tuple[tuple[Any, float], ...] = ()
    """Its own (reward function, weight) pairs, added to the shared reward."""


def trained_roles(agents: list[Any], loss_type: str) -> list[Role]:
    """The roles of the sub-agents with `train: true` (`agents`: a whole tree); raises ValueError on a set-up
    that cannot be trained."""
    roles = [Role(a.name, a.adapter, a.learning_rate, a.rewards) for a in agents if a.train]
    if not roles:
        return []
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"co-trained sub-agents use the loss types {LOSS_TYPES}; the recipe's `loss_type` is "
                         f"`{loss_type}`: pick one of those")  # fmt: skip
    adapters = [r.adapter for r in roles]
    shared = sorted({a for a in adapters if adapters.count(a) > 1} | ({"default"} & set(adapters)))
    if shared:
        raise ValueError(f"trained sub-agents need an adapter each, not the policy's (`default`); {shared} is "
                         "named twice: give each trained sub-agent its own `adapter`")  # fmt: skip
    names = [r.name for r in roles]
    if POLICY_ROLE in names or len(set(names)) < len(names):
        raise ValueError(f"a trained sub-agent may not be named `{POLICY_ROLE}` (the policy's role) or share a name")
    return roles


def adapter_of(parameter_name: str) -> str | None:
    """The LoRA adapter a PEFT parameter belongs to (`...q_proj.lora_A.helper.weight` -> `helper`), or None."""
    parts = parameter_name.split(".")
    for part, following in zip(parts, parts[1:], strict=False):
        if part.startswith("lora_"):
            return following
    return None


def role_param_groups(groups: list[dict[str, Any]], names: dict[int, str], roles: list[Role]) -> list[dict]:
    """The optimizer's parameter groups split by role: each role's parameters in groups of their own, at its
    learning rate when it has one. `names`: parameter id -> name."""
    by_adapter = {r.adapter: r for r in roles}
    split = []
    for group in groups:
        parts: dict[str, list] = defaultdict(list)
        for p in group["params"]:
            adapter = adapter_of(names.get(id(p), ""))
            parts[adapter if adapter in by_adapter else POLICY_ROLE].append(p)
        for owner, params in parts.items():
            role = by_adapter.get(owner)
            extra = {"lr": role.learning_rate} if role is not None and role.learning_rate is not None else {}
            split.append({**group, "params": params, **extra, "role": role.name if role else POLICY_ROLE})
    return split


def collect_samples(trajectories: list[Any], roles: list[Role], mask_truncated: bool) -> list[list[ChildSample]]:
    """Each root trajectory's children written by a trained role (descendants included), as samples; a child's
    reward is its root's plus its role's own rewards."""
    by_adapter = {r.adapter: r for r in roles}
    samples: list[list[ChildSample]] = []
    children: dict[str, list[tuple[ChildSample, Any]]] = defaultdict(list)
    for root in trajectories:
        mine = []
        if root.reward is None:  # no reward scored the root: its children have no outcome to learn from
            samples.append(mine)
            continue
        for child in descendants(root):
            role = by_adapter.get(child.delegation.adapter if child.delegation else None)
            mask = masked_loss_mask(child, mask_truncated)
            if role is None or not any(mask):
                continue
            sample = ChildSample(role.name, child.prompt_ids, child.completion_ids, mask, float(root.reward))
            sample.sampling_logps = child.completion_logprobs
            mine.append(sample)
            children[role.name].append((sample, child))
        samples.append(mine)
    for role in roles:
        if role.rewards and children[role.name]:
            scores = role_rewards(role.rewards, [child for _, child in children[role.name]])
            for (sample, _), own in zip(children[role.name], scores, strict=True):
                sample.role_scores = own
    return samples


def role_rewards(rewards: tuple[tuple[Any, float], ...], children: list[Any]) -> list[tuple[float, ...]]:
    """Each child trajectory's scores from a role's own rewards, weighted (NaN where a reward gave None), called
    as the recipe's rewards are (`score_trajectories`), on the sub-task rows' columns."""
    funcs = [func for func, _ in rewards]
    scores = score_trajectories(funcs, children, [child.delegation.row for child in children])
    per_reward = [
        [math.nan if score is None else weight * score for score in scores[func.__name__]] for func, weight in rewards
    ]
    return list(zip(*per_reward, strict=True)) if per_reward else [() for _ in children]


def assign_advantages(
    samples: list[list[ChildSample]], group_size: int, first_row: int, scale_rewards: str
) -> dict[str, dict[str, float]]:
    """Each sample's reward (its root's plus its role's own rewards, a missing one filled with its group's mean)
    and advantage within its role's group (module docstring); `first_row`: the global index of this process's
    first row. Collective: every process calls it. Returns each role's reward and sample count."""
    local = [(r.role, (first_row + i) // group_size, r.reward, r.role_scores, float(sum(r.loss_mask)))
             for i, row in enumerate(samples) for r in row]  # fmt: skip
    everything = gather_object(local)
    own: dict[tuple[str, int], list[tuple[float, ...]]] = defaultdict(list)
    for role, group, _, scores, _ in everything:
        own[role, group].append(scores)
    # A role's reward that gave None counts as that reward's mean over the group, as the policy's missing rewards
    # do (`agentic_grpo.advantages`); missing throughout the group, it counts as 0 for every member.
    fill = {key: [_nanmean(column) for column in zip(*rows, strict=True)] for key, rows in own.items()}

    def total(role: str, group: int, reward: float, scores: tuple[float, ...]) -> float:
        filled = (m if math.isnan(s) else s for s, m in zip(scores, fill[role, group], strict=True))
        return reward + sum(0.0 if math.isnan(v) else v for v in filled)

    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    by_role: dict[str, list[float]] = defaultdict(list)
    tokens: dict[str, float] = defaultdict(float)
    for role, group, reward, scores, count in everything:
        paid = total(role, group, reward, scores)
        groups[role, group].append(paid)
        by_role[role].append(paid)
        tokens[role] += count
    for i, row in enumerate(samples):
        for sample in row:
            sample.reward = total(sample.role, (first_row + i) // group_size, sample.reward, sample.role_scores)
            rewards = groups[sample.role, (first_row + i) // group_size]
            mean = sum(rewards) / len(rewards)
            spread = by_role[sample.role] if scale_rewards == "batch" else rewards
            std = _std(spread)
            advantage = 0.0 if all_equal(rewards) else sample.reward - mean  # flat: exactly 0, as the policy's
            sample.advantage = advantage / (std + 1e-4) if scale_rewards != "none" else advantage
            sample.role_tokens = tokens[sample.role]
    return {role: {"reward": sum(r) / len(r), "samples": float(len(r))} for role, r in by_role.items()}


def _nanmean(values: tuple[float, ...]) -> float:
    present = [v for v in values if not math.isnan(v)]
    return sum(present) / len(present) if present else math.nan


def _std(values: list[float]) -> float:
    """Unbiased standard deviation, as TRL's; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


class CoTraining:
    """The co-trained roles of one trainer: samples and advantages at generation, their losses per micro-batch.

    Args:
        trainer: the `AgenticGRPOTrainer` (its model, args, TRL's log-prob helper and metrics).
        roles: from `trained_roles`.
    """

    def __init__(self, trainer: Any, roles: list[Role]) -> None:
        self.trainer = trainer
        self.roles = roles

    @classmethod
    def for_trainer(cls, trainer: Any, agents: list[Any]) -> CoTraining:
        """The co-training of the sub-agents with `train: true` among `agents` (a whole tree), whose adapters are
        on the trainer's model (the layer's set-up check has refused a recipe without one)."""
        return cls(trainer, trained_roles(agents, trainer.args.loss_type))

    def split_param_groups(self, optimizer: Any, model: Any) -> None:
        """Replace `optimizer`'s parameter groups by `role_param_groups` (once; before any step)."""
        if any("role" in group for group in optimizer.param_groups):
            return
        names = {id(p): n for n, p in model.named_parameters()}
        groups = role_param_groups(optimizer.param_groups, names, self.roles)
        optimizer.param_groups.clear()
        for group in groups:
            optimizer.add_param_group(group)

    def peft_model(self, model: Any = None) -> Any:
        return self.trainer.accelerator.unwrap_model(model if model is not None else self.trainer.model)

    def make_trainable(self) -> None:
        """Every trained role's adapter parameters require grad (PEFT's loading or switching may have frozen them)."""
        adapters = {r.adapter for r in self.roles}
        for name, p in self.peft_model().named_parameters():
            if adapter_of(name) in adapters:
                p.requires_grad_(True)

    # --- at generation ----------------------------------------------------------------

    def samples_for(self, inputs: list[dict[str, Any]], mode: str) -> list[list[ChildSample]]:
        """The role samples of a scored batch (one list per row), with advantages and, when the loss needs them,
        old and reference log-probs; logs `roles/<name>/reward` and `/samples`."""
        trainer = self.trainer
        trajectories = [row["trajectory"] for row in inputs]
        samples = collect_samples(trajectories, self.roles, trainer.mask_truncated_by_finish_reason)
        group = trainer.num_generations if mode == "train" else trainer.num_generations_eval
        first = trainer.accelerator.process_index * len(inputs)
        summary = assign_advantages(samples, group, first, trainer.scale_rewards)
        rewards = gather_object([t.reward for t in trajectories if t.reward is not None])
        summary[POLICY_ROLE] = {"reward": sum(rewards) / max(len(rewards), 1), "samples": float(len(rewards))}
        trainer.log_metrics(
            {
                f"roles/{role}/{key}": value
                for role in [POLICY_ROLE, *(r.name for r in self.roles)]
                for key, value in summary.get(role, {"samples": 0.0}).items()  # no samples: no reward to log
            },
            mode,
        )
        generate_every = trainer.args.steps_per_generation * trainer.num_iterations
        needs_old = trainer.args.gradient_accumulation_steps % generate_every != 0
        if needs_old or trainer.beta != 0.0:
            self._add_logprobs([s for row in samples for s in row], needs_old)
        if mode == "train" and canary_limit(trainer):
            self._check_sampler_agreement([s for row in samples for s in row])
        return samples

    @torch.no_grad()
    def _check_sampler_agreement(self, samples: list[ChildSample]) -> None:
        """The sampler-trainer canary (`agentic_grpo.canaries`) for each role's children: the role's log-probs of
        its sampled tokens, under its adapter, against its sampler's. Co-training runs in one process, so the
        figures are this process's."""
        trainer, limit = self.trainer, canary_limit(self.trainer)
        agents = {agent.name: agent for agent in trainer.rollout_parts.agents}
        for role in self.roles:
            mine = [s for s in samples if s.role == role.name and s.sampling_logps is not None]
            if not mine:
                continue
            if all(s.old_logps is not None for s in mine):
                scored_rows = [s.old_logps for s in mine]
            else:
                with adapter_active(self.peft_model(), role.adapter):
                    scored_rows = self._logps(mine)
            width = max(len(s.completion_ids) for s in mine)
            sampled = completion_tensor(mine, "sampling_logps", width, "cpu")
            scored = torch.zeros_like(sampled)
            for i, row in enumerate(scored_rows):
                scored[i, : len(row)] = torch.tensor(row)
            mask = completion_tensor(mine, "loss_mask", width, "cpu")
            metrics = logprob_agreement(sampled, scored, mask, lambda t: t)
            trainer.log_metrics({key.replace("canary/", f"canary/{role.name}/"): v for key, v in metrics.items()})
            if metrics and metrics["canary/logprob_diff/mean"] > limit:
                source = getattr(agents.get(role.name), "source", None)
                temperature = getattr(source, "temperature", None)
                longest = max(len(s.prompt_ids) for s in mine)
                padded = torch.tensor([len(s.prompt_ids) < longest for s in mine])
                found = likely_causes(sampled, scored, mask, padded, 0, temperature, trainer.temperature)
                step = trainer.state.global_step + 1
                raise CanaryError(
                    sampler_disagreement(metrics, limit, step, None, found, who=f" of sub-agent `{role.name}`")
                )

    @torch.no_grad()
    def _add_logprobs(self, samples: list[ChildSample], old: bool) -> None:
        model = self.peft_model()
        for role in self.roles:
            mine = [s for s in samples if s.role == role.name]
            if not mine:
                continue
            if old:
                with adapter_active(model, role.adapter):
                    for s, logps in zip(mine, self._logps(mine), strict=True):
                        s.old_logps = logps
            if self.trainer.beta != 0.0:
                with model.disable_adapter():
                    for s, logps in zip(mine, self._logps(mine), strict=True):
                        s.ref_logps = logps

    def _logps(self, samples: list[ChildSample]) -> list[list[float]]:
        trainer = self.trainer
        ids, attention, width = padded(samples, trainer.processing_class.pad_token_id, trainer.accelerator.device)
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attention, width, batch_size=trainer.args.per_device_train_batch_size
        )
        return [row[: len(s.completion_ids)].tolist() for row, s in zip(logps.float().cpu(), samples, strict=True)]

    # --- in the loss ------------------------------------------------------------------

    def backward(self) -> Any:
        """The accelerator's backward, when a child's loss can be back-propagated on its own inside `compute_loss`
        with the gradients the Trainer's backward of the summed loss would give; else None. That holds in one
        process without DeepSpeed (whose backward also steps its engine) while gradients are on (not in eval)."""
        accelerator = self.trainer.accelerator
        alone = accelerator.num_processes == 1 and accelerator.distributed_type != DistributedType.DEEPSPEED
        return accelerator.backward if alone and torch.is_grad_enabled() else None

    def log_policy_loss(self, loss: torch.Tensor) -> None:
        """`roles/policy/loss` and `/kl`: TRL's loss of this micro-batch (unscaled) and the KL it just logged."""
        trainer = self.trainer
        mode = "train" if trainer.model.training else "eval"
        accumulation = trainer.current_gradient_accumulation_steps if mode == "train" else 1.0
        values = {f"roles/{POLICY_ROLE}/loss": loss.item() * accumulation}
        logged_kl = trainer.logged_values("kl", mode)
        if logged_kl:
            values[f"roles/{POLICY_ROLE}/kl"] = logged_kl[-1]
        trainer.log_metrics(values, mode)

    def losses(self, model: Any, rows: list[list[ChildSample]], backward: Any = None) -> dict[str, torch.Tensor]:
        """Each role's GRPO loss over the children of one micro-batch's rows (`rows`: their samples), scaled
        for gradient accumulation as TRL scales the policy's; logs `roles/<name>/loss` and what TRL's loss logs.

        With `backward` (the accelerator's), each child's share of its role's loss is back-propagated at once,
        one child at a time, and the losses come back detached: only one child's graph is alive at a time
        (a batch of children held beside the policy's graph was most of co-training's peak memory)."""
        # PEFT re-enabling adapters after `disable_adapter()` (TRL's reference log-probs, `__base__` sub-agents)
        # freezes every adapter but the active one: the roles' adapters are made trainable again first.
        self.make_trainable()
        mode = "train" if self.trainer.model.training else "eval"
        found = {}
        for role in self.roles:
            mine = [s for row in rows for s in row if s.role == role.name]
            if not mine:
                continue
            parts = []
            for chunk in [[s] for s in mine] if backward else [mine]:
                loss = role_loss(self.trainer, model, role.name, role.adapter, mine, chunk)
                if backward:
                    backward(loss)
                    loss = loss.detach()
                parts.append(loss)
            found[role.name] = sum(parts)
            accumulation = self.trainer.current_gradient_accumulation_steps if mode == "train" else 1.0
            self.trainer.log_metrics({f"roles/{role.name}/loss": found[role.name].item() * accumulation}, mode)
        return found
