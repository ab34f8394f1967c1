"""Scheduler settings (the daemon fills them from its TOML config; every field has a default)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerConfig:
    """Knobs of the scheduler.

    ``instances_per_device`` is how many jobs one GPU runs at once: that many Plan
    instances are compiled per (model, device), and the device has that many run threads.
    Overlapping jobs hides copy-in/copy-out and fence latency: on an H200, mobilenet fp16 with
    batches of 8 served 2,160 req/s with 2 and 3,098 with 4 (2,702 with 8: smaller batches;
    RESULTS.md, issue 14). ``cpu_instances`` is the same for the CPU device, whose kernels use
    every core within a job: two in flight overlap one job's Python with the other's kernels.
    ``inline_run_ms``: a run expected (measured) to take less than this, while nothing else is
    in flight, runs on the event loop's own thread rather than a device's run thread; 0 never.
    Short, because the loop reads nothing meanwhile: on an H200, digits (0.17 ms runs) answered
    a sequential client in 0.70-0.75 ms instead of 0.88-0.95, but mobilenet's 0.45 ms runs
    inline cut one load process's 32 in flight from 887-987 to 722-733 req/s (its requests no
    longer read, and batched, while one ran).
    """

    queue_limit_per_model: int = 64  # queued (not yet running) jobs per model; more -> OVERLOADED
    instances_per_device: int = 4  # concurrent jobs (Plan instances) per GPU
    cpu_instances: int = 2  # concurrent jobs on the CPU device
    default_priority: int = 0  # priority of requests that give none; higher runs first
    load_threads: int = 4  # parallel model loads (compile + weight upload), like Triton's default
    default_warmup: int = 1  # warm-up runs per Plan instance when config.toml gives none
    latency_ewma_alpha: float = 0.2  # weight of the newest run in the per-(model, device) EWMA
    default_latency_s: float = 0.01  # latency prior for a (model, device) never measured
    inline_run_ms: float = 0.25  # shorter runs, all there is to do, run on the loop's thread
    use_vulkan: bool = True  # False: serve on the CPU only even when GPUs and the engine exist
    cache_dir: str | None = None  # pipeline caches of Vulkan devices (None: no persistence)

    def __post_init__(self) -> None:
        if self.queue_limit_per_model < 1:
            raise ValueError(f"queue_limit_per_model must be >= 1, got {self.queue_limit_per_model}")
        if self.instances_per_device < 1:
            raise ValueError(f"instances_per_device must be >= 1, got {self.instances_per_device}")
        if self.cpu_instances < 1:
            raise ValueError(f"cpu_instances must be >= 1, got {self.cpu_instances}")
        if self.load_threads < 1:
            raise ValueError(f"load_threads must be >= 1, got {self.load_threads}")
        if self.default_warmup < 0:
            raise ValueError(f"default_warmup must be >= 0, got {self.default_warmup}")
        if not 0.0 < self.latency_ewma_alpha <= 1.0:
            raise ValueError(f"latency_ewma_alpha must be in (0, 1], got {self.latency_ewma_alpha}")
        if not 0.0 <= self.inline_run_ms <= 1000.0:
            raise ValueError(f"inline_run_ms must be in [0, 1000], got {self.inline_run_ms}")
        if self.default_latency_s <= 0:
            raise ValueError(f"default_latency_s must be > 0, got {self.default_latency_s}")
