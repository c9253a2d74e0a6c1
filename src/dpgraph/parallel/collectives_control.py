"""Caffe2's ``CollectivesConcurrencyControl``: spread collectives over a bounded number of
common worlds, serialising the ones that share a world through control inputs."""

from __future__ import annotations

from typing import Any

from dpgraph.parallel._emit import emit, make_op


def _rdv(rendezvous: Any, key: str, default: Any = None) -> Any:
    if isinstance(rendezvous, dict):
        return rendezvous.get(key, default)
    return getattr(rendezvous, key, default)


def create_or_clone_common_world(net: Any, common_world_blob: str, rendezvous: Any,
                                 name: str | None = None,
                                 timeout_sec: float | None = None) -> str:
    """``CreateCommonWorld`` in ``net``, or ``CloneCommonWorld`` of an existing one with
    the same timeout."""
    if timeout_sec is None:
        from dpgraph import data_parallel_model

        timeout_sec = data_parallel_model._DEFAULT_TIMEOUT_SEC
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
    ``max_concurrent_context``, chained to the slot's previous output."""

    def __init__(self, name: str, max_concurrent_context: int, param_init_net: Any,
                 rendezvous: Any) -> None:
        self.name = name
        self.param_init_net = param_init_net
        self.max_concurrent_context = max_concurrent_context
        self.counter = 0
        self.common_worlds: list[Any] = []
        self.control_inputs: list[Any] = []
        self.rendezvous = rendezvous

    def get_control_and_context(self, control_output_blob: Any) -> tuple[Any, Any]:
        current_slot = self.counter % self.max_concurrent_context
        control_input = None
        if len(self.common_worlds) < self.max_concurrent_context:
            common_world = create_or_clone_common_world(
                self.param_init_net, f"{self.name}_{current_slot}_cw", self.rendezvous)
            self.common_worlds.append(common_world)
            self.control_inputs.append(control_output_blob)
        else:
            common_world = self.common_worlds[current_slot]
            control_input = self.control_inputs[current_slot]
            self.control_inputs[current_slot] = control_output_blob
        self.counter += 1
        return common_world, control_input
