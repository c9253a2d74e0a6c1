"""Train from an LMDB the way Caffe2 scripts do, then save and reload the parameters.

1. Write scikit-learn's 8x8 digits into two LMDBs of ``TensorProtos`` records (a FLOAT
   ``[1, 8, 8]`` image and an INT32 label, keys ``str(j)``), exactly as Caffe2's
   ``lmdb_create_example.py`` writes them with the ``lmdb`` package.
2. Train a small MLP with ``Parallelize`` on 4 CPU devices; each device reads its own shard
   of the training DB through ``CreateDB`` + ``TensorProtosDBInput``.
3. ``Save`` the parameters of ``cpu_0`` to a minidb, ``Load`` them into a fresh workspace
   (``strip_prefix``) and evaluate the test split read through ``TensorProtosDBInput``.

    python examples/lmdb_training.py [--iters 300] [--workdir DIR]

Everything goes through the Caffe2 import alias, so the script reads like a Caffe2 one.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

import lmdb
import numpy as np

from dpgraph.compat import caffe2 as caffe2_alias

caffe2_alias.install()

from caffe2.proto import caffe2_pb2  # noqa: E402
from caffe2.python import (  # noqa: E402
    brew,
    core,
    data_parallel_model,
    model_helper,
    optimizer,
    scope,
    workspace,
)

DEVICES, BATCH_PER_DEVICE = 4, 16


def write_lmdb(path: str, images: np.ndarray, labels: np.ndarray) -> None:
    """lmdb_create_example.py's layout: key str(j), TensorProtos(FLOAT data, INT32 label)."""
    env = lmdb.open(path, map_size=1 << 40)
    with env.begin(write=True) as txn:
        for j, (image, label) in enumerate(zip(images, labels)):
            protos = caffe2_pb2.TensorProtos()
            data = protos.protos.add()
            data.dims.extend(image.shape)
            data.data_type = caffe2_pb2.TensorProto.FLOAT
            data.float_data.extend(image.reshape(-1).tolist())
            label_proto = protos.protos.add()
            label_proto.data_type = caffe2_pb2.TensorProto.INT32
            label_proto.int32_data.append(int(label))
            txn.put(str(j).encode("ascii"), protos.SerializeToString())
    env.close()


def make_dbs(workdir: str) -> tuple[str, str, int]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # [N, 1, 8, 8]
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], digits.target[order]
    split = 1400
    train, test = os.path.join(workdir, "digits_train"), os.path.join(workdir, "digits_test")
    write_lmdb(train, images[:split], labels[:split])
    write_lmdb(test, images[split:], labels[split:])
    return train, test, len(images) - split


def mlp(model: Any, data: Any) -> Any:
    flat = model.net.Flatten(data, "flat")
    hidden = brew.relu(model, brew.fc(model, flat, "fc1", dim_in=64, dim_out=64), "fc1")
    return brew.fc(model, hidden, "fc2", dim_in=64, dim_out=10)


def train(train_db: str, iters: int) -> Any:
    model = model_helper.ModelHelper(name="lmdb_mlp")

    def input_builder(m: Any) -> None:
        shard = int(scope.CurrentNameScope().split("_")[1].rstrip("/"))
        reader = m.CreateDB("reader", db=train_db, db_type="lmdb", num_shards=DEVICES,
                            shard_id=shard)
        m.net.TensorProtosDBInput(reader, ["data", "label"], batch_size=BATCH_PER_DEVICE)

    def forward(m: Any, loss_scale: float) -> list[Any]:
        logits = mlp(m, "data")
        softmax, loss = m.net.SoftmaxWithLoss([logits, "label"], ["softmax", "loss"])
        brew.accuracy(m, [softmax, "label"], "accuracy")
        return [m.net.Scale(loss, "scaled_loss", scale=loss_scale)]

    data_parallel_model.Parallelize(
        model, input_builder, forward,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.2, momentum=0.9),
        devices=list(range(DEVICES)), cpu_device=True)
    data_parallel_model.RunInitNet(model)  # also creates the training net
    for step in range(iters):
        data_parallel_model.RunNet(model, 1)
        if step % 100 == 0 or step == iters - 1:
            loss = float(workspace.FetchBlob("cpu_0/loss"))
            print(f"iter {step:4d}  loss {loss:.3f}  "
                  f"accuracy {float(workspace.FetchBlob('cpu_0/accuracy')):.2f}")
    return model


def save_params(model: Any, path: str) -> list[str]:
    params = [str(p) for p in model.GetParams("cpu_0/")]
    workspace.RunOperatorOnce(core.CreateOperator(
        "Save", params, [], db=path, db_type="minidb", absolute_path=1, strip_prefix="cpu_0/"))
    return [p[len("cpu_0/"):] for p in params]


def evaluate(params_db: str, test_db: str, test_count: int, names: list[str]) -> float:
    """A fresh workspace: Load the parameters, read the whole test split, predict."""
    workspace.SwitchWorkspace("lmdb_training_eval", True)
    workspace.ResetWorkspace()
    workspace.RunOperatorOnce(core.CreateOperator(
        "Load", [], names, db=params_db, db_type="minidb", absolute_path=1))
    model = model_helper.ModelHelper(name="lmdb_eval", init_params=False)
    model.TensorProtosDBInput([], ["data", "label"], batch_size=test_count, db=test_db,
                              db_type="lmdb")
    softmax = model.net.Softmax(mlp(model, "data"), "softmax")
    brew.accuracy(model, [softmax, "label"], "accuracy")
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    accuracy = float(workspace.FetchBlob("accuracy"))
    workspace.SwitchWorkspace("default")
    return accuracy


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="dpgraph_lmdb_")
    train_db, test_db, test_count = make_dbs(workdir)
    print(f"wrote {train_db} and {test_db}")
    model = train(train_db, args.iters)
    params_db = os.path.join(workdir, "mlp_params.minidb")
    names = save_params(model, params_db)
    print(f"saved {len(names)} parameters to {params_db}")
    accuracy = evaluate(params_db, test_db, test_count, names)
    print(f"test accuracy after Load in a fresh workspace: {accuracy:.3f}")
    return accuracy


if __name__ == "__main__":
    sys.exit(0 if main() > 0.85 else 1)
