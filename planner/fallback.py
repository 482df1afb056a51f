"""Module-chain plans: the plan files of models the tracer could not follow, before they got native plans.

Until plans of such models were made from an eager step (planner/untraced.py), ``planner.plan``
checkpointed whole blocks of the model's chain of repeated blocks (its largest ``nn.ModuleList`` or
``nn.Sequential``), as few as made the *measured* step fit, chosen by bisection over the blocks
ordered by bytes saved per second of recomputation; its figures were measured, not predicted
(``"figures": "measured"`` in its file). Nothing makes such a plan any more. Its files (format
``plan-checkpoints/module-chain/1``) still load as a :class:`ModuleChainPlan` and still apply
(runtime/chain.py: the blocks wrapped in torch.utils.checkpoint, on a copy of the module tree); a
new plan of the same model is a :class:`planner.native_plan.NativePlan`.

Its ``graph`` and ``schedule`` describe the blocks (one forward and one backward node per block; a
checkpointed block's forward node is freed after the forward and computed again before its backward)
so that tools reading any plan keep working; they are a description, not what the figures come from.
"""

from __future__ import annotations

from dataclasses import dataclass

from .budget import format_bytes
from .planfile import FORMAT as PLAN_FORMAT
from .planfile import Plan, PlanFileError, _seconds, _text, _whole

CHAIN_FORMAT = "plan-checkpoints/module-chain/1"
METHOD = "module-chain"


class FallbackWarning(UserWarning):
    """Warned when a model the tracer could not follow got a module-chain plan. No longer warned (such
    models get native plans); kept so that code filtering it (``warnings.simplefilter("ignore",
    planner.FallbackWarning)``) still runs."""


@dataclass(frozen=True)
class BlockCost:
    """One block of the chain, measured in an eager forward."""

    path: str
    saved_bytes: int  # bytes autograd saves inside the block, its inputs and the parameters excluded
    seconds: float  # forward time: what recomputing it costs


@dataclass(frozen=True)
class ModuleChain:
    """What a module-chain plan checkpoints, and why it exists."""

    container: str  # path of the nn.ModuleList / nn.Sequential ("" for the model itself)
    blocks: tuple[BlockCost, ...]
    checkpointed: tuple[str, ...]  # block paths, in the chain's order
    reason: str  # why the tracer could not be used

    @property
    def block_paths(self) -> list[str]:
        return [b.path for b in self.blocks]

    def to_dict(self) -> dict:
        return {
            "container": self.container,
            "blocks": [{"path": b.path, "saved_bytes": b.saved_bytes, "seconds": b.seconds} for b in self.blocks],
            "checkpointed": list(self.checkpointed),
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: dict) -> ModuleChain:
        blocks = tuple(
            BlockCost(_text(b["path"]), _whole(b["saved_bytes"]), _seconds(b["seconds"])) for b in data["blocks"]
        )
        checkpointed = tuple(_text(p) for p in data["checkpointed"])
        unknown = [p for p in checkpointed if p not in {b.path for b in blocks}]
        if unknown:
            raise ValueError(f"checkpointed block {unknown[0]!r} is not one of the chain's blocks")
        return cls(_text(data["container"]), blocks, checkpointed, _text(data.get("reason", "")))


@dataclass
class ModuleChainPlan(Plan):
    """A plan that checkpoints whole blocks (see the module docstring). ``predicted_peak_bytes`` and
    ``predicted_seconds`` are measured on the example inputs, as are the ``unplanned_*`` figures."""

    chain: ModuleChain | None = None

    @property
    def fallback(self) -> str:
        """Why this plan is not a traced schedule, and what it does instead."""
        chain = self.chain
        where = f"'{chain.container}'" if chain.container else "the model itself"
        return (
            f"could not trace the training step ({chain.reason}); fell back to checkpointing whole blocks of "
            f"{where} with torch.utils.checkpoint: {len(chain.checkpointed)} of {len(chain.blocks)} blocks. "
            "Peak and time are measured on the example inputs, not predicted from a cost graph"
        )

    def summary(self) -> str:
        chain = self.chain
        saved = self.unplanned_peak_bytes - self.predicted_peak_bytes
        shown = ", ".join(chain.checkpointed[:6])
        if len(chain.checkpointed) > 6:
            shown += f" and {len(chain.checkpointed) - 6} more"
        lines = [
            f"Model:             {self.model or '?'}; inputs {', '.join(self.inputs) or '?'}",
            f"FALLBACK:          {self.fallback}",
            f"Budget:            {format_bytes(self.budget_bytes)} ({self.budget_text}) for the whole step; "
            f"parameters, buffers and inputs take {format_bytes(self.fixed_bytes)}",
            f"Measured peak:     {format_bytes(self.predicted_peak_bytes)}, without checkpointing "
            f"{format_bytes(self.unplanned_peak_bytes)} ({format_bytes(saved)} less)",
            f"Measured time:     {self.predicted_seconds * 1000:.1f} ms per step, {self.predicted_overhead:+.1%} over "
            f"{self.unplanned_seconds * 1000:.1f} ms without checkpointing (medians of 3 steps)",
            f"Checkpointed:      {shown or 'nothing (the step fits without checkpointing)'}",
        ]
        if self.autocast:
            lines.append(f"Autocast:          measured under torch.autocast ({self.autocast})")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        data = super().to_dict()
        data["format"] = CHAIN_FORMAT
        data["figures"] = "measured"
        data["chain"] = self.chain.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict, source: str = "plan") -> ModuleChainPlan:
        try:
            chain = ModuleChain.from_dict(data["chain"])
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise PlanFileError(f"{source} is not a valid plan: {type(error).__name__}: {error}") from None
        plain = Plan.from_dict({**data, "format": PLAN_FORMAT}, source, check_figures=False)  # measured
        fields = {name: getattr(plain, name) for name in Plan.__dataclass_fields__}
        return cls(**fields, chain=chain)


__all__ = ["BlockCost", "CHAIN_FORMAT", "FallbackWarning", "ModuleChain", "ModuleChainPlan"]
