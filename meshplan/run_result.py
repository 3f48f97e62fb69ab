"""RunResult: what `meshplan run` measured (run.json), merged into the report beside the prediction."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.schema import check

RUN_SCHEMA_VERSION = 1


@dataclass(kw_only=True)
class RunResult:
    schema_version: int = RUN_SCHEMA_VERSION
    run_id: str = ""
    """The launch's id; every rank's status and result file of the run carries it."""
    plan_hash: str = ""
    """content_hash of the plan that was executed."""
    world_size: int
    steps: int
    losses: list[float | None]
    """One loss per step from step `first_loss_step` (the global-batch mean), identical on every
    rank; null where the loss was not finite (the run diverged; `notes` says from which step)."""
    step_time_s: float
    """Median step time after warm-up."""
    step_times_s: list[float] = field(default_factory=list)
    """Every step's wall time, warm-up included."""
    tokens_per_s: float
    """Global tokens (samples x seq) per second at the median step time."""
    peak_memory_bytes: int
    """Max over ranks (CUDA max allocated; live-tensor tracker on CPU)."""
    peak_memory_per_rank_bytes: list[int] = field(default_factory=list)
    device: str = "cpu"
    backend: str = "gloo"
    torch_version: str = ""
    resumed_from_step: int = 0
    losses_from_step: int | None = None
    """Steps done before losses[0]: 0 when a resumed run's run.json continues the earlier one's
    losses (and step times) up to the checkpoint; None (run.json before this field): the
    resumed steps only, from resumed_from_step."""
    comm_bytes_per_step: dict[str, int] = field(default_factory=dict)
    """Data-parallel bytes on the wire per step and rank, by mesh axis ("dp_replicate",
    "dp_shard"): the max over ranks of each rank's mean over the steps after the first, counted
    by the executor's hooks under meshplan/comm_bytes.py's convention (what
    Prediction.comm_bytes_per_step predicts)."""
    comm_bytes_per_step_by_rank: list[dict[str, int]] = field(default_factory=list)
    """Each rank's mean per step after the first, by mesh axis (rank order)."""
    comm_bytes_by_step: list[dict[str, int]] = field(default_factory=list)
    """Rank 0's bytes in every step, by mesh axis (warm-up steps included)."""
    phase_times_s: dict[str, float] = field(default_factory=dict)
    """Seconds per step in each phase of the step (executor/phases.py: data, forward, backward,
    pipeline, dp_comm, grad_clip, optimizer, sync), each rank's mean over the steps the step time
    is taken over, then the mean over ranks; they add up to about the mean of those steps."""
    phase_times_per_rank_s: list[dict[str, float]] = field(default_factory=list)
    """Each rank's phase seconds (rank order), as phase_times_s before the mean over ranks."""
    complete: bool = True
    """False in a run.json written while the run goes (after each step) and left so by a run that
    was killed, failed or interrupted: `steps`, `losses` and `step_times_s` then hold the steps
    done so far; the launcher writes the full result, complete, once every rank reported."""
    notes: list[str] = field(default_factory=list)

    def validate(self, path: str = "") -> None:
        p = f"{path}." if path else ""
        check(
            self.schema_version == RUN_SCHEMA_VERSION,
            f"{p}schema_version",
            self.schema_version,
            f"this meshplan reads run.json schema {RUN_SCHEMA_VERSION}; re-run meshplan run",
        )
        check(
            0 <= self.first_loss_step <= self.resumed_from_step,
            f"{p}losses_from_step",
            self.losses_from_step,
            f"must be between 0 and resumed_from_step {self.resumed_from_step}",
        )
        check(
            len(self.losses) == self.steps - self.first_loss_step,
            f"{p}losses",
            len(self.losses),
            f"need one loss per step from step {self.first_loss_step} to {self.steps}",
        )
        check(self.step_time_s >= 0, f"{p}step_time_s", self.step_time_s, "must be >= 0")

    @property
    def first_loss_step(self) -> int:
        """Steps done before losses[0] (losses[i] is the loss of step first_loss_step + i + 1)."""
        return self.resumed_from_step if self.losses_from_step is None else self.losses_from_step
