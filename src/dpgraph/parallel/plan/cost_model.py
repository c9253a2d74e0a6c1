"""The alpha-beta cost model of a collective backend.

A collective of ``n`` bytes over ``p`` ranks costs, with ``alpha`` the latency of one
collective step and ``beta`` the time per byte on a link (a ring all-reduce is a
reduce-scatter then an all-gather, ``p - 1`` steps each)::

    allreduce(n, p) = 2 (p - 1) alpha + 2 (p - 1) / p * n * beta

Where the transport's work runs on the cores the ranks compute on (loopback Gloo with as
many processes as free cores), a collective also takes CPU time from the overlapped compute.
That is a measured term of the same form, ``contention(n, p) = 2 (p - 1) cpu_alpha +
2 (p - 1) / p * n * cpu_beta`` (compute time one rank loses per collective; 0 where the
transport has cores of its own, the default).

``local`` is the in-process reduction over local devices (one ``Sum``/``Copy`` chain per
blob: ``alpha`` is one op's overhead, ``beta`` the memory time per byte and extra copy).
Models are loaded from a JSON file (``DPGRAPH_COST_MODEL`` or ``dpgraph plan --calibrate``'s
output) or calibrated by :mod:`dpgraph.parallel.plan.calibrate`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from dpgraph.errors import ParallelizeError

ENV_VAR = "DPGRAPH_COST_MODEL"


@dataclass(frozen=True)
class AlphaBeta:
    """Latency per collective step (s) and time per byte (s/B) of one backend, and the
    compute time a rank loses to a collective that overlaps its compute (same form)."""

    alpha: float
    beta: float
    cpu_alpha: float = 0.0
    cpu_beta: float = 0.0

    def allreduce(self, nbytes: float, ranks: int) -> float:
        """Ring all-reduce time of ``nbytes`` over ``ranks`` (0 for one rank)."""
        if ranks <= 1:
            return 0.0
        return 2 * (ranks - 1) * self.alpha + 2 * (ranks - 1) / ranks * nbytes * self.beta

    def contention(self, nbytes: float, ranks: int) -> float:
        """Compute time one rank loses while an all-reduce of ``nbytes`` overlaps it."""
        if ranks <= 1:
            return 0.0
        return (2 * (ranks - 1) * self.cpu_alpha
                + 2 * (ranks - 1) / ranks * nbytes * self.cpu_beta)

    def local_reduce(self, nbytes: float, devices: int) -> float:
        """Sum over ``devices`` local copies and copy back: ``devices - 1`` adds and copies."""
        if devices <= 1:
            return 0.0
        return self.alpha * devices + 2 * (devices - 1) * nbytes * self.beta


# `dpgraph plan --calibrate` on the development machine (2 processes on loopback, torch
# Gloo; Sum/Copy nets for local devices); NCCL: typical NVLink figures.  Calibrate for the
# machines you run on.
DEFAULTS: dict[str, AlphaBeta] = {
    "gloo": AlphaBeta(alpha=6.0e-5, beta=7.0e-10),
    "nccl": AlphaBeta(alpha=1.5e-5, beta=1.0e-10),
    "local": AlphaBeta(alpha=2.0e-6, beta=4.0e-11),
}


@dataclass(frozen=True)
class CostModel:
    """Alpha-beta figures per backend plus the compute speed (FLOP/s) of one worker."""

    backends: Mapping[str, AlphaBeta] = field(default_factory=lambda: dict(DEFAULTS))
    flops_per_sec: float = 5.0e10
    source: str = "defaults"

    def __post_init__(self) -> None:  # backends not given keep their default figures
        merged = {**DEFAULTS, **{k.lower(): v for k, v in self.backends.items()}}
        object.__setattr__(self, "backends", merged)

    def backend(self, name: str) -> AlphaBeta:
        key = name.lower()
        if key not in self.backends:
            raise ParallelizeError(
                f"The cost model ({self.source}) has no figures for backend {name!r}; known: "
                f"{sorted(self.backends)}. Calibrate it with `dpgraph plan --calibrate`.")
        return self.backends[key]

    def with_overrides(self, backend: str, alpha: float | None = None,
                       bandwidth: float | None = None,
                       flops_per_sec: float | None = None) -> CostModel:
        """A copy with ``alpha`` (s), ``bandwidth`` (B/s) or compute speed replaced."""
        current = self.backend(backend)
        figures = replace(current, alpha=alpha if alpha is not None else current.alpha,
                          beta=1.0 / bandwidth if bandwidth else current.beta)
        backends = {**self.backends, backend.lower(): figures}
        return CostModel(backends, flops_per_sec or self.flops_per_sec, self.source)

    def to_json(self) -> dict[str, Any]:
        return {"backends": {k: asdict(v) for k, v in self.backends.items()},
                "flops_per_sec": self.flops_per_sec}

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")


def from_json(data: Mapping[str, Any], source: str = "json") -> CostModel:
    """A CostModel from :meth:`CostModel.to_json`'s form (missing backends keep defaults)."""
    try:
        backends = dict(DEFAULTS)
        for name, figures in dict(data.get("backends", {})).items():
            backends[name.lower()] = AlphaBeta(
                float(figures["alpha"]), float(figures["beta"]),
                float(figures.get("cpu_alpha", 0.0)), float(figures.get("cpu_beta", 0.0)))
        speed = float(data.get("flops_per_sec", CostModel().flops_per_sec))
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        raise ParallelizeError(
            f"Cost model {source}: expected {{'backends': {{name: {{'alpha': s, 'beta': s/B "
            f"(optional 'cpu_alpha': s, 'cpu_beta': s/B)}}}}, "
            f"'flops_per_sec': n}}; {error}") from error
    return CostModel(backends, speed, source)


def load(path: str | os.PathLike[str] | None = None) -> CostModel:
    """The model in ``path``, else in ``$DPGRAPH_COST_MODEL``, else the defaults.

    Every rank must load the same figures: ``"auto"`` bucket sizes derive from them (the
    collective-schedule check reports ranks that disagree).
    """
    path = path or os.environ.get(ENV_VAR)
    if not path:
        return CostModel()
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ParallelizeError(f"Cannot read the cost model {str(path)!r}: {error}. Write one "
                               "with `dpgraph plan --calibrate PATH`.") from error
    return from_json(data, str(path))
