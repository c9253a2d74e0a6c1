"""Committed snapshots of the NetDefs ``Parallelize`` and ``Parallelize_BMUF`` emit.

Every scenario below builds one parallelized model (graph only, nothing runs); the nets it
runs are serialized and compared with ``data/netdef_snapshots.json``: a sha256 of each
serialized NetDef (the byte-exact check) and one readable line per op (so a failure shows the
first op that changed).  Regenerate, after a deliberate change of the emitted graph, with::

    python tests/parallel/_snapshots.py --update            # every scenario
    python tests/parallel/_snapshots.py --update gpu_sum_4  # only some
    python tests/parallel/_snapshots.py                     # check, print differences

Each scenario starts from fresh process-wide counters (net names, optimizer instances), and
Python-op tokens (also process-wide) are renumbered by first appearance before hashing.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dpgraph import brew, cnn, core, data_parallel_model, model_helper, optimizer, workspace
from dpgraph.proto import caffe2_pb2

HERE = Path(__file__).resolve().parent
if __name__ == "__main__":  # run as a script: the test helper folders on the path
    sys.path[:0] = [str(HERE), str(HERE.parent)]
SNAPSHOT_FILE = HERE / "data" / "netdef_snapshots.json"


# --- what is compared --------------------------------------------------------------------------
def model_nets(model: Any) -> dict[str, Any]:
    """Every NetDef a parallelized model runs, by a stable label (a net listed twice, e.g.
    ``model.net`` in ``_data_parallel_model_nets``, maps to the first label)."""
    nets: dict[str, Any] = {"param_init_net": model.param_init_net.Proto(),
                            "net": model.net.Proto()}
    for kind in ("init_nets", "nets"):
        for i, entry in enumerate(getattr(model, f"_data_parallel_model_{kind}", [])):
            net = entry[0] if isinstance(entry, tuple) else entry
            nets[f"{kind}[{i}]:{net.Proto().name}"] = net.Proto()
    for attr in ("_warmup_broadcast", "_checkpoint_net"):
        net = getattr(model, attr, None)
        if net is not None:
            nets[attr.lstrip("_")] = net.Proto()
    first: dict[int, str] = {}
    for label, proto in nets.items():
        if first.setdefault(id(proto), label) != label:
            nets[label] = first[id(proto)]
    return nets


def normalized(proto: caffe2_pb2.NetDef) -> caffe2_pb2.NetDef:
    """A copy with Python-op tokens renumbered in order of first appearance."""
    copy = caffe2_pb2.NetDef()
    copy.CopyFrom(proto)
    tokens: dict[bytes, bytes] = {}
    for op in copy.op:
        for arg in op.arg:
            if arg.name == "token" and arg.HasField("s"):
                arg.s = tokens.setdefault(arg.s, f"python_op_#{len(tokens)}".encode())
    return copy


def _arg_text(arg: caffe2_pb2.Argument) -> str:
    for field in ("f", "i", "s"):
        if arg.HasField(field):
            return f"{arg.name}={getattr(arg, field)!r}"
    if arg.HasField("n"):
        return f"{arg.name}=<net {arg.n.name}: {len(arg.n.op)} ops>"
    values = list(arg.floats) or list(arg.ints) or list(arg.strings)
    return f"{arg.name}={values!r}"


def op_line(op: caffe2_pb2.OperatorDef) -> str:
    device = op.device_option
    where = f"{device.device_type}:{device.device_id}" if op.HasField("device_option") else "-"
    parts = [f"{op.type}({', '.join(op.input)}) -> ({', '.join(op.output)}) @{where}"]
    if op.name:
        parts.append(f"name={op.name!r}")
    if op.engine:
        parts.append(f"engine={op.engine}")
    if op.control_input:
        parts.append(f"ctrl={list(op.control_input)}")
    parts.extend(_arg_text(a) for a in op.arg)
    return " ".join(parts)


def describe(proto: caffe2_pb2.NetDef) -> list[str]:
    head = (f"net {proto.name!r} type={proto.type!r} num_workers={proto.num_workers} "
            f"args={[_arg_text(a) for a in proto.arg]}")
    return ([head, f"external_input={list(proto.external_input)}",
             f"external_output={list(proto.external_output)}"]
            + [op_line(op) for op in proto.op])


def capture(model: Any) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    for label, proto in model_nets(model).items():
        if isinstance(proto, str):
            result[label] = {"same_as": proto, "sha256": proto, "lines": []}
            continue
        proto = normalized(proto)
        result[label] = {"sha256": hashlib.sha256(proto.SerializeToString()).hexdigest(),
                         "lines": describe(proto)}
    return result


# --- scenarios ---------------------------------------------------------------------------------
Scenario = Callable[[], Any]
SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str) -> Callable[[Scenario], Scenario]:
    def register(fun: Scenario) -> Scenario:
        assert name not in SCENARIOS, name
        SCENARIOS[name] = fun
        return fun
    return register


def _helpers() -> Any:
    import _parallel_helpers

    return _parallel_helpers


def _build(devices: Any, **kwargs: Any) -> Any:
    return _helpers().build(devices, **kwargs)


def _add(name: str, devices: Any, **kwargs: Any) -> None:
    scenario(name)(lambda: _build(devices, **kwargs))


def _forward(kind: str) -> Any:
    return getattr(_helpers(), f"{kind}_forward")


# plain single-host Parallelize on CPU devices
_add("cpu_1_manual", [0])
_add("cpu_2_manual", [0, 1])
_add("cpu_3_noncontiguous", [1, 2, 3])
_add("cpu_2_sgd", [0, 1], update="sgd")
_add("cpu_2_momentum", [0, 1], update="momentum")
_add("cpu_2_clip_lr_injection", [0, 1], update="clip")
_add("cpu_2_simple_net_threads", [0, 1], net_type="simple", num_threads_per_device=2)
_add("cpu_2_forward_only", [0, 1], update=None)
_add("cpu_2_shared_model", [0, 1], shared_model=True)
_add("cpu_2_shared_model_momentum", [0, 1], shared_model=True, update="momentum")
_add("cpu_2_optimize_gradient_memory", [0, 1], optimize_gradient_memory=True)
_add("cpu_2_dynamic_memory", [0, 1], dynamic_memory_management=True, blobs_to_keep=["fc2_w"])
_add("ideep_2_manual", [0, 1], ideep=True)


@scenario("cpu_4_bn_computed_params")
def _cpu_bn() -> Any:
    return _build(range(4), forward=_forward("bn"), update="momentum")


@scenario("cpu_2_bn_no_computed_broadcast")
def _cpu_bn_no_broadcast() -> Any:
    return _build([0, 1], forward=_forward("bn"), broadcast_computed_params=False)


@scenario("cpu_2_combine_spatial_bn")
def _cpu_combine_bn() -> Any:
    return _build([0, 1], forward=_forward("bn"), combine_spatial_bn=True)


# virtual GPUs
for _n in (1, 2, 3, 4, 8, 16):
    _add(f"gpu_sum_{_n}", range(_n), gpu=True)
_add("gpu_4_nccl", range(4), gpu=True, use_nccl=True)
_add("gpu_4_momentum_nccl_simple", range(4), gpu=True, update="momentum", use_nccl=True,
     net_type="simple")
_add("gpu_3_noncontiguous", [1, 3, 5], gpu=True, update="sgd")


@scenario("gpu_4_no_peer_access")
def _gpu_no_peer() -> Any:
    peer = np.ones((4, 4), dtype=bool)
    peer[0, 2] = peer[2, 0] = False
    workspace.SetVirtualGpus(4, peer_access=peer)
    return _build(range(4), gpu=True)


@scenario("gpu_8_no_peer_access_0_4")
def _gpu_no_peer_8() -> Any:
    peer = np.ones((8, 8), dtype=bool)
    peer[:4, 4:] = peer[4:, :4] = False
    workspace.SetVirtualGpus(8, peer_access=peer)
    return _build(range(8), gpu=True, update="momentum")


@scenario("gpu_2_sparse")
def _gpu_sparse() -> Any:
    return _build(range(2), gpu=True, forward=_forward("sparse"))


@scenario("gpu_4_sparse_sgd")
def _gpu_sparse_sgd() -> Any:
    return _build(range(4), gpu=True, forward=_forward("sparse"), update="sgd")


def _two_gathers(model: Any, loss_scale: float) -> list[Any]:
    helpers = _helpers()
    losses = []
    for tag in ("a", "b"):
        emb = model.create_param(f"emb_{tag}", [helpers.VOCAB, helpers.EMB],
                                 helpers._initializer("XavierFill"))
        rows = model.net.Gather([emb, "indices"], f"rows_{tag}")
        out = brew.fc(model, rows, f"fc_{tag}", helpers.EMB, helpers.OUT)
        dist = model.net.SquaredL2Distance([out, "label"], f"dist_{tag}")
        losses.append(model.net.AveragedLoss(dist, f"loss_{tag}"))
    return losses


@scenario("gpu_2_shared_indices")
def _gpu_shared_indices() -> Any:
    return _build(range(2), gpu=True, forward=_two_gathers)


@scenario("gpu_4_bn_combine_spatial_bn")
def _gpu_combine_bn() -> Any:
    return _build(range(4), gpu=True, forward=_forward("bn"), update="momentum",
                  combine_spatial_bn=True)


@scenario("gpu_2_bn_forward_only")
def _gpu_bn_forward_only() -> Any:
    return _build(range(2), gpu=True, forward=_forward("bn"), update=None)


# builder hooks
def _transformer(model: Any, ndev: int, prefix: str, device_type: int) -> None:
    model.net.Proto().arg.add(name=f"transformed_{ndev}_{prefix}", i=int(device_type))


def _pre_grad(model: Any) -> None:
    model.net.Proto().arg.add(name="pre_grad", i=len(model.net.Proto().op))


def _post_sync(model: Any) -> None:
    model.param_init_net.ConstantFill([], "post_sync_marker", shape=[1], value=2.0)


_add("cpu_2_transformers", [0, 1], net_transformer_fun=_transformer,
     pre_grad_net_transformer_fun=_pre_grad, post_sync_builder_fun=_post_sync)
_add("gpu_2_post_sync_momentum", range(2), gpu=True, update="momentum",
     post_sync_builder_fun=_post_sync)


# conv nets: NHWC CNNModelHelper, and a small ResNet (the bench model, fewer blocks)
def _conv_forward(model: Any, loss_scale: float) -> list[Any]:
    conv = brew.conv(model, "image", "conv1", 2, 4, 3, pad=1)
    bn = brew.spatial_bn(model, conv, "bn1", 4, epsilon=1e-5, is_test=False)
    relu = brew.relu(model, bn, bn)
    pool = brew.max_pool(model, relu, "pool1", kernel=3, stride=1)
    fc = brew.fc(model, pool, "pred", 4, 3)
    softmax, loss = model.net.SoftmaxWithLoss([fc, "label"], ["softmax", "loss"])
    brew.accuracy(model, [softmax, "label"], "accuracy")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


@scenario("gpu_2_conv_bn_momentum")
def _gpu_conv() -> Any:
    return _build(range(2), gpu=True, forward=_conv_forward, update="momentum")


@scenario("cpu_2_cnn_nhwc_manual")
def _cpu_cnn_nhwc() -> Any:
    import _dpm_updates

    model = cnn.CNNModelHelper(order="NHWC", name="cnn_nhwc")
    data_parallel_model.Parallelize_CPU(model, input_builder_fun=lambda m: None,
                                        forward_pass_builder_fun=_conv_forward,
                                        param_update_builder_fun=_dpm_updates.manual_sgd,
                                        devices=[0, 1])
    return model


def _resnet_forward(model: Any, loss_scale: float) -> list[Any]:
    sys.path.insert(0, str(HERE.parent.parent / "bench"))
    try:
        import parallelize as bench
    finally:
        sys.path.pop(0)
    saved = bench.STAGES
    bench.STAGES = [(1, 64, 256, 1), (2, 128, 512, 2)]
    try:
        return bench.resnet50_forward(model, loss_scale)
    finally:
        bench.STAGES = saved


def _resnet(devices: list[int], **kwargs: Any) -> Any:
    workspace.SetVirtualGpus(max(devices) + 1)
    model = model_helper.ModelHelper(name="resnet_small")
    data_parallel_model.Parallelize(
        model, lambda m: None, _resnet_forward,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.1, momentum=0.9,
                                                             nesterov=False),
        devices=devices, **kwargs)
    return model


scenario("gpu_2_resnet_small_momentum")(lambda: _resnet([0, 1], combine_spatial_bn=True))
scenario("gpu_5_resnet_small_momentum")(lambda: _resnet([4, 0, 1, 2, 3]))


@scenario("cpu_2_python_op")
def _cpu_python_op() -> Any:
    def square(inputs: Any, outputs: Any) -> None:
        outputs[0].feed(inputs[0].data ** 2)

    def square_grad(inputs: Any, outputs: Any) -> None:
        outputs[0].feed(2 * inputs[0].data * inputs[2].data)

    def forward(model: Any, loss_scale: float) -> list[Any]:
        h = brew.fc(model, "data", "h", 4, 3)
        h2 = model.net.Python(square, square_grad)([h], ["h2"])
        out = brew.fc(model, h2, "out", 3, 1)
        dist = model.net.SquaredL2Distance([out, "target"], "dist")
        return [model.net.Scale(model.net.AveragedLoss(dist, "loss"), "ls", scale=loss_scale)]

    return _build([0, 1], forward=forward, update="momentum")


@scenario("cpu_3_python_op")
def _cpu_python_op_3() -> Any:
    def double(inputs: Any, outputs: Any) -> None:
        outputs[0].feed(2 * inputs[0].data)

    def forward(model: Any, loss_scale: float) -> list[Any]:
        h = brew.fc(model, "data", "h", 4, 3)
        h2 = model.net.Python(double)([h], ["h2"])
        dist = model.net.SquaredL2Distance([h2, "target"], "dist")
        return [model.net.Scale(model.net.AveragedLoss(dist, "loss"), "ls", scale=loss_scale)]

    return _build([0, 1, 2], forward=forward)


def _auto_named_forward(model: Any, loss_scale: float) -> list[Any]:
    """Ops without output names: the net names their outputs from a per-net counter."""
    hidden = model.net.Relu(brew.fc(model, "data", "fc1", 6, 5))
    out = brew.fc(model, hidden, "fc2", 5, 3)
    dist = model.net.SquaredL2Distance([out, "label"])
    loss = model.net.AveragedLoss(dist)
    return [model.net.Scale(loss, scale=loss_scale)]


@scenario("gpu_3_auto_named_blobs")
def _gpu_auto_names() -> Any:
    return _build(range(3), gpu=True, forward=_auto_named_forward)


def _lstm_forward(model: Any, loss_scale: float) -> list[Any]:
    from dpgraph import rnn_cell

    output, _, _, _ = rnn_cell.LSTM(model, "seq", "seq_lengths", ("h0", "c0"), 4, 3,
                                    scope="lstm")
    dist = model.net.SquaredL2Distance([model.net.Flatten(output, "flat"), "target"], "dist")
    return [model.net.Scale(model.net.AveragedLoss(dist, "loss"), "ls", scale=loss_scale)]


@scenario("cpu_3_lstm")
def _cpu_lstm() -> Any:
    return _build([0, 1, 2], forward=_lstm_forward, update="sgd")


@scenario("cpu_4_input_builder")
def _cpu_input_builder() -> Any:
    def add_input(model: Any) -> None:
        model.net.UniformFill([], "data", shape=[8, 6], min=-1.0, max=1.0)
        model.param_init_net.ConstantFill([], "label", shape=[8, 3], value=0.5)

    import _dpm_updates

    model = model_helper.ModelHelper(name="input_builder")
    data_parallel_model.Parallelize(model, add_input, _forward("mlp"),
                                    param_update_builder_fun=_dpm_updates.manual_sgd,
                                    devices=[3, 0, 2, 1], cpu_device=True)
    return model


# the conformance builders (Caffe2's DPM tests): per-device Iter/LR/WeightedSum
def _conformance_builders() -> Any:
    """tests/conformance/_dpm_graph_builders.py, loaded by path (not a package)."""
    import importlib.util

    name = "_dpm_graph_builders"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, HERE.parent / "conformance" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def _conformance(devices: list[int], gpu: bool = False, **kwargs: Any) -> Any:
    return _conformance_builders().parallelize(devices, gpu=gpu, **kwargs)


scenario("conformance_cpu_2")(lambda: _conformance([0, 1]))
scenario("conformance_gpu_8_build_sgd")(lambda: _conformance(
    list(range(8)), gpu=True, optimizer_builder_fun=_conformance_sgd()))


def _conformance_sgd() -> Any:
    return _conformance_builders().build_sgd


# multi-host graphs (nothing runs: the rendezvous only shapes the graph)
def _rendezvous(engine: str = "GLOO", **extra: Any) -> dict[str, Any]:
    return {"kv_handler": "store_handler", "shard_id": 1, "num_shards": 2, "engine": engine,
            **extra}


_add("multihost_cpu_3_gloo", [1, 2, 3], rendezvous=_rendezvous(), barrier_net_timeout_sec=5)


@scenario("multihost_cpu_2_gloo_bn_momentum")
def _multihost_bn() -> Any:
    return _build([0, 1], forward=_forward("bn"), update="momentum",
                  rendezvous=_rendezvous(transport="tcp", interface="eth0"),
                  max_concurrent_distributed_ops=2)


_add("multihost_gpu_2_gloo_ibverbs", range(2), gpu=True,
     rendezvous=_rendezvous(transport="ibverbs"))
_add("multihost_gpu_2_nccl_staged", range(2), gpu=True, use_nccl=True,
     rendezvous=_rendezvous(engine="NCCL"))
_add("multihost_cpu_2_non_gloo_staged", [0, 1], update="momentum",
     rendezvous=_rendezvous(engine="REDIS"))
_add("single_shard_rendezvous", [0, 1], rendezvous={"kv_handler": None, "shard_id": 0,
                                                      "num_shards": 1, "engine": "GLOO"})


@scenario("cpu_2_add_blob_sync_and_checkpoint")
def _lifecycle() -> Any:
    model = _build([0, 1], update="momentum")
    data_parallel_model.AddBlobSync(model, ["fc1_w"])
    return model


# Parallelize_BMUF
def _bmuf_forward(model: Any, loss_scale: float) -> list[Any]:
    fc = brew.fc(model, "data", "fc", 16, 1)
    flat = model.net.FlattenToVec(fc, "fc_fl")
    sigm = model.net.Sigmoid(flat, "sigm")
    sq = model.net.SquaredL2Distance([sigm, "label"], "sq")
    loss = model.net.AveragedLoss(sq, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def _momentum_update(model: Any) -> None:
    it = brew.iter(model, "ITER")
    lr = model.net.LearningRate([it], "LR", base_lr=-0.1, policy="fixed")
    for param in model.GetParams():
        grad = model.param_to_grad[param]
        mom = model.param_init_net.ConstantFill(
            [param], core.BlobReference(str(param) + "_momentum"), value=0.0)
        model.net.MomentumSGDUpdate([grad, mom, lr, param], [grad, mom, param], momentum=0.9)


def _bmuf(devices: list[int], gpu: bool = False, update: Any = None, **kwargs: Any) -> Any:
    import _dpm_updates

    if gpu:
        workspace.SetVirtualGpus(max(devices) + 1)
    model = model_helper.ModelHelper(name="bmuf")
    fun = (data_parallel_model.Parallelize_GPU_BMUF if gpu
           else data_parallel_model.Parallelize_CPU_BMUF)
    fun(model, lambda m: None, _bmuf_forward, update or _dpm_updates.manual_sgd,
        devices=devices, **kwargs)
    return model


scenario("bmuf_cpu_2")(lambda: _bmuf([0, 1]))
scenario("bmuf_gpu_4_nesterov_master_2")(lambda: _bmuf(
    [0, 1, 2, 3], gpu=True, nesterov=True, master_device=2, block_momentum=0.5))
scenario("bmuf_cpu_2_warmup_reset_sync")(lambda: _bmuf(
    [0, 1], update=_momentum_update, warmup_iterations=3, reset_momentum_sgd=True,
    add_blobs_to_sync=["ONE_extra"]))
scenario("bmuf_cpu_2_optimize_gradient_memory")(lambda: _bmuf(
    [0, 1], optimize_gradient_memory=True))
scenario("bmuf_gpu_2_multihost_gloo")(lambda: _bmuf([0, 1], gpu=True,
                                                    rendezvous=_rendezvous()))
scenario("bmuf_cpu_2_multihost_staged")(lambda: _bmuf([0, 1],
                                                      rendezvous=_rendezvous("REDIS")))


# --- running and comparing ---------------------------------------------------------------------
@contextlib.contextmanager
def clean_state() -> Iterator[None]:
    """A clean workspace, no virtual GPUs, and net names as in a fresh process (Net names
    are made unique process-wide; names used before are added back afterwards)."""
    from dpgraph.ir import net as ir_net
    from dpgraph.modeling.optimizer import base as optimizer_base

    used = set(ir_net._used_net_names)
    counts = dict(optimizer_base._optimizer_instance_count)
    ir_net._used_net_names.clear()
    optimizer_base._optimizer_instance_count.clear()
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(0)
    try:
        yield
    finally:
        workspace.ResetWorkspace()
        workspace.SetVirtualGpus(0)
        ir_net._used_net_names.update(used)
        for name, count in counts.items():
            optimizer_base._optimizer_instance_count[name] = max(
                count, optimizer_base._optimizer_instance_count[name])


def run(name: str) -> dict[str, dict[str, Any]]:
    """The captured nets of scenario ``name``, built in a clean workspace."""
    with clean_state():
        return capture(SCENARIOS[name]())


def load() -> dict[str, Any]:
    return json.loads(SNAPSHOT_FILE.read_text())


def differences(name: str, want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Readable differences between two captures of ``name`` (empty when identical)."""
    problems = []
    for label in sorted(set(want) | set(got)):
        if label not in got or label not in want:
            where = "expected only" if label in want else "new"
            problems.append(f"{name}: net {label}: {where}")
            continue
        if want[label]["sha256"] == got[label]["sha256"]:
            continue
        diff = list(difflib.unified_diff(want[label]["lines"], got[label]["lines"],
                                         "snapshot", "now", n=1, lineterm=""))
        if not diff:
            diff = ["(every op line is the same: the bytes differ in field order or "
                    "in a field the lines do not show)"]
        problems.append(f"{name}: net {label} differs:\n" + "\n".join(diff[:60]))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Parallelize NetDef snapshots")
    parser.add_argument("--update", action="store_true", help="rewrite the snapshots")
    parser.add_argument("names", nargs="*", help="scenarios (default: all)")
    args = parser.parse_args(argv)
    import logging

    logging.disable(logging.WARNING)
    names = args.names or list(SCENARIOS)
    stored = load() if SNAPSHOT_FILE.exists() else {}
    problems: list[str] = []
    for name in names:
        got = run(name)
        if args.update:
            stored[name] = got
        elif name not in stored:
            problems.append(f"{name}: no snapshot")
        else:
            problems.extend(differences(name, stored[name], got))
    if args.update:
        stored = {k: stored[k] for k in SCENARIOS if k in stored}
        SNAPSHOT_FILE.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT_FILE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(names)} scenario(s) to {SNAPSHOT_FILE}")
    print("\n".join(problems) if problems else f"{len(names)} scenario(s) identical")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
