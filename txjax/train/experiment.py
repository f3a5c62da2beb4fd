"""What every experiment script shares: the run folder, resume-or-start, the loop, the summary.

A run lives in `<runs_dir>/<name>/`: config.json, metrics.jsonl, checkpoints/, plots and
summary.json. Starting a script again with the same name resumes from the latest
checkpoint (refused, with the differing fields listed, if the configs differ).

With $JAX_COORDINATOR_ADDRESS, $JAX_NUM_PROCESSES and $JAX_PROCESS_ID (or $TXJAX_DISTRIBUTED=auto)
a script runs as one of several processes of one run (`initialize_distributed`); they share
the run folder, which process 0 owns (txjax.train.multihost).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from txjax.train.checkpoint import Checkpointer, CheckpointMismatch, CheckpointWriteError
from txjax.train.cli import given_preset, parse_configs
from txjax.train.config import TrainConfig
from txjax.train.loop import NonFiniteLoss, RunDirError, fit, restore_or_init, write_json
from txjax.train.multihost import lead_decides
from txjax.train.rundir import claim_shared_run_dir
from txjax.train.sharding import initialize_distributed
from txjax.train.steps import Stepper, TrainState


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Where a run writes, and whether it resumes."""

    name: str = "run"  # run folder name: <runs_dir>/<name>
    runs_dir: str = "runs"  # parent folder of all runs
    overwrite: bool = False  # delete an existing <runs_dir>/<name> and start over instead of resuming

    def __post_init__(self):
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ValueError(f"name must be a plain folder name, got {self.name!r}")

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.name


def config_sections(model_cfg, train_cfg: TrainConfig, run_cfg) -> dict[str, dict]:
    """The JSON form of a run's configs, as saved in config.json and every checkpoint."""
    return {"model": model_cfg.to_dict(), "train": train_cfg.to_dict(), "run": dataclasses.asdict(run_cfg)}


# Fields that may differ between a checkpoint and the run resuming it. The model's
# execution (txjax.config.ExecutionConfig) is recorded beside these but never compared.
RESUME_IGNORES = {"train": TrainConfig.RESUMABLE_CHANGES,
                  "run": ("overwrite", "runs_dir", "temperature", "num_samples", "top_k", "show", "quality_samples")}


def on_accelerator() -> bool:
    return jax.default_backend() != "cpu"


def train_run(
    model,
    loss_fn,
    train_cfg: TrainConfig,
    run_cfg,
    batches,
    *,
    extra_meta: dict | None = None,
    eval_fn: Callable[[Stepper, Any], dict] | None = None,
    stop_at: int | None = None,
    log: Callable[[str], None] = print,
) -> tuple[Stepper, TrainState, dict]:
    """Claim the run folder (one run at a time; emptied first with `run_cfg.overwrite`), resume or
    start, train, and return (stepper, state, fit summary). Several processes: one run, the
    folder claimed and written by process 0 (see the module docstring), with parallelism dp or fsdp.

    extra_meta: more JSON saved in config.json and checkpoints (e.g. the tokenizer); the
    model's execution config is saved there too, as "execution".
    eval_fn(stepper, params) -> {name: value}: held-out metrics during and after training.
    """
    if train_cfg.parallelism == "none" and jax.process_count() > 1:
        # Each process would train its own copy on its own device, all in one run folder. Which of
        # dp and fsdp fits the memory is the user's choice, so none is made here.
        raise ValueError(f"parallelism 'none' trains on one device, but this run has {jax.process_count()} "
                         "processes: pass --parallelism dp (a copy of the state per device) or fsdp (split)")
    with claim_shared_run_dir(run_cfg.run_dir, overwrite=run_cfg.overwrite) as run_dir:
        return _train_in(run_dir, model, loss_fn, train_cfg, run_cfg, batches, extra_meta, eval_fn, stop_at, log)


def _train_in(run_dir, model, loss_fn, train_cfg, run_cfg, batches, extra_meta, eval_fn, stop_at, log):
    """train_run inside its claimed folder; config.json is written only once a resume is accepted."""
    sections = config_sections(model.config, train_cfg, run_cfg)
    extra_meta = {"execution": model.execution.to_dict(), **(extra_meta or {})}
    stepper = Stepper(model, loss_fn, train_cfg)
    checkpointer = Checkpointer(run_dir / "checkpoints", keep=train_cfg.keep_checkpoints, log=log)
    try:
        state, start = restore_or_init(stepper, checkpointer, batches, sections, RESUME_IGNORES)
        lead_decides(lambda: write_json(run_dir / "config.json", {**sections, **extra_meta}), errors=(OSError,))
        if start:
            log(f"resuming {run_dir} from step {start}")
        if start >= train_cfg.steps:
            log(f"{run_dir} already finished {start} steps")
        state, summary = fit(
            stepper, state, batches, run_dir=run_dir, checkpointer=checkpointer,
            meta={**sections, **extra_meta}, start_step=start,
            eval_fn=None if eval_fn is None else (lambda params: eval_fn(stepper, params)),
            stop_at=stop_at, log=log,
        )
    finally:
        checkpointer.close()
    summary["resumed_from"] = start
    return stepper, state, summary


def backend_preset(presets: dict) -> tuple[str, str]:
    """(preset, why) for a run without --preset: "cpu" where JAX finds no accelerator, else "default"
    (sized for one GPU or TPU)."""
    backend = jax.default_backend()
    if on_accelerator() or "cpu" not in presets:
        return "default", f"JAX found an accelerator (backend {backend})"
    return "cpu", "JAX found no accelerator (backend cpu)"


BF16_DOT_FLAGS = ("avx512_bf16", "amx_bf16")
"""x86 CPU flags for bfloat16 dot products: with one, XLA:CPU runs bf16 x bf16 -> f32 matmuls faster
than float32 ones; without, it converts and runs them slower (BUILD.md, "CPU presets")."""


def cpu_compute_dtype(cpuinfo: str | Path = "/proc/cpuinfo") -> tuple[str, str]:
    """(dtype, why) for a CPU preset: "bfloat16" where the CPU has bfloat16 dot instructions,
    else "float32" (also where `cpuinfo` cannot be read: not Linux)."""
    try:
        flags = set(Path(cpuinfo).read_text().split())
    except OSError:
        flags = set()
    found = [f for f in BF16_DOT_FLAGS if f in flags]
    if found:
        return "bfloat16", f"this CPU has bfloat16 dot instructions ({', '.join(found)})"
    return "float32", f"this CPU has no bfloat16 dot instructions ({' / '.join(BF16_DOT_FLAGS)})"


def preset_line(preset: str, forced: bool, why: str) -> str:
    """The script's first line: which preset runs, and why."""
    if not forced:
        other = "default" if preset == "cpu" else "cpu"
        return f"preset {preset}: {why}; --preset {other} forces the other"
    if preset != "cpu" and not on_accelerator():
        return (f"preset {preset} (--preset): sized for an accelerator, JAX found none, so it will be slow "
                "here; --preset cpu is sized for 2 CPU cores")
    return f"preset {preset} (--preset)"


def train_script(run_fn, presets: dict, make_parser, argv=None, *, locate: Callable = lambda run: run,
                 log: Callable[[str], None] = print, notes: dict[str, str] | None = None) -> dict:
    """What a train_*.py script does: pick the preset (`--preset`, else the one for the backend: see
    `backend_preset`), say which and why, apply the flags, then `run_fn(model, train, locate(run),
    execution=...)`; an error a user can fix is one line.

    locate(run config) -> run config: the script's chance to fill in data paths.
    notes: preset -> what the first line adds when that preset runs (how the preset was fitted to this machine).
    First of all, before any device is touched, it joins the other processes of a multi-process
    run when the environment says so (`initialize_distributed`), and leaves them at the end.
    """
    distributed = initialize_distributed()
    try:
        auto, why = backend_preset(presets)
        preset, cfg = parse_configs(make_parser, presets, argv, auto)
        note = (notes or {}).get(preset)
        log(preset_line(preset, given_preset(argv) is not None, why) + (f"; {note}" if note else ""))
        try:
            return run_fn(cfg["model"], cfg["train"], locate(cfg["run"]), execution=cfg["execution"])
        except (NonFiniteLoss, CheckpointMismatch, CheckpointWriteError, RunDirError, FileNotFoundError,
                ValueError) as err:
            fail(str(err))
    finally:
        if distributed:
            jax.distributed.shutdown()  # waits for every process: none exits while another still needs it


def fail(message: str, code: int = 1) -> None:
    """Print an error for a user (no traceback) and exit."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)
