"""`agentic-grpo audit-rewards`: adversarial trajectories against a recipe's rewards, before GPU hours are spent."""

from agentic_grpo.audit.probes import GAMING_PROBES, JUDGE_REPLY_PROBE, Probe, build_probes
from agentic_grpo.audit.run import AuditReport, audit_recipe

__all__ = ["GAMING_PROBES", "JUDGE_REPLY_PROBE", "AuditReport", "Probe", "audit_recipe", "build_probes"]
