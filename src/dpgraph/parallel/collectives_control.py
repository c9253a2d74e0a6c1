"""Caffe2's ``CollectivesConcurrencyControl``: spread collectives over a bounded number of
common worlds, serialising the ones that share a world through control inputs."""

from __future__ import annotations

from typing import Any

from dpgraph.parallel._emit import emit, make_op
from dpgraph.parallel.config import DEFAULT_TIMEOUT_SEC


def _rdv(rendezvous: Any, key: str, default: Any = None) -> Any:
    if isinstance(rendezvous, dict):
        return rendezvous.get(key, default)
    return getattr(rendezvous, key, default)


def create_or_clone_common_world(net: Any, common_world_blob: str, rendezvous: Any,
                                 name: str | None = None,
                                 timeout_sec: float | None = None) -> str:
    """``CreateCommonWorld`` in ``net``, or ``CloneCommonWorld`` of an existing one with
    the same timeout (default :data:`~dpgraph.parallel.config.DEFAULT_TIMEOUT_SEC`)."""
    if timeout_sec is None:
        timeout_sec = DEFAULT_TIMEOUT_SEC
    timeout_ms = int(timeout_sec * 1000)
    existing = None
    for op in net.Proto().op:
        if op.type != "CreateCommonWorld":
            continue
        op_timeout = next((a.i for a in op.arg if a.name == "timeout_ms"), -1)
        if op_timeout == timeout_ms:
            existing = op.output[0]
            break
    name = name or f"{common_world_blob}_op"
    engine = _rdv(rendezvous, "engine")
    if existing is not None:
        emit(net, make_op("CloneCommonWorld", [existing], [common_world_blob], name=name,
                          engine=engine))
        return common_world_blob
    extra: dict[str, Any] = {}
    for key in ("transport", "interface"):
        if _rdv(rendezvous, key):
            extra[key] = _rdv(rendezvous, key)
    if _rdv(rendezvous, "mpi_rendezvous"):
        extra["mpi_rendezvous"] = True
    handler = _rdv(rendezvous, "kv_handler")
    emit(net, make_op("CreateCommonWorld", [handler] if handler else [], [common_world_blob],
                      name=name, engine=engine, size=_rdv(rendezvous, "num_shards"),
                      rank=_rdv(rendezvous, "shard_id"), timeout_ms=timeout_ms, **extra))
    return common_world_blob


class CollectivesConcurrencyControl:
    """Hands out ``(common_world, control_input)`` for the k-th collective: slot k mod
    ``max_concurrent_context``, chained to the slot's previous output.

    Common worlds are created with the ``timeout_sec`` attribute, or when that is ``None``
    (Caffe2's class) :meth:`default_timeout_sec`, read when each world is created; see
    :func:`concurrency_control`.
    """

    def __init__(self, name: str, max_concurrent_context: int, param_init_net: Any,
                 rendezvous: Any) -> None:
        self.name = name
        self.param_init_net = param_init_net
        self.max_concurrent_context = max_concurrent_context
        self.counter = 0
        self.common_worlds: list[Any] = []
        self.control_inputs: list[Any] = []
        self.rendezvous = rendezvous
        self.timeout_sec: float | None = None

    def default_timeout_sec(self) -> float:
        """The timeout of common worlds made without an explicit ``timeout_sec``."""
        return DEFAULT_TIMEOUT_SEC

    def get_control_and_context(self, control_output_blob: Any) -> tuple[Any, Any]:
        current_slot = self.counter % self.max_concurrent_context
        control_input = None
        if len(self.common_worlds) < self.max_concurrent_context:
            timeout = self.default_timeout_sec() if self.timeout_sec is None else \
                self.timeout_sec
            common_world = create_or_clone_common_world(
                self.param_init_net, f"{self.name}_{current_slot}_cw", self.rendezvous,
                timeout_sec=timeout)
            self.common_worlds.append(common_world)
            self.control_inputs.append(control_output_blob)
        else:
            common_world = self.common_worlds[current_slot]
            control_input = self.control_inputs[current_slot]
            self.control_inputs[current_slot] = control_output_blob
        self.counter += 1
        return common_world, control_input


def concurrency_control(name: str, max_concurrent_context: int, param_init_net: Any,
                        rendezvous: Any, timeout_sec: float) -> CollectivesConcurrencyControl:
    """A :class:`CollectivesConcurrencyControl` whose common worlds time out after
    ``timeout_sec`` (the Parallelize call's, from its config)."""
    control = CollectivesConcurrencyControl(name, max_concurrent_context, param_init_net,
                                            rendezvous)
    control.timeout_sec = timeout_sec
    return control
