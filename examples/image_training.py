"""Train an image classifier from JPEG files through ``ImageInput``, as resnet50_trainer does.

1. Generate a folder of small JPEGs (two classes: horizontal vs vertical stripes, random
   colours and phases).
2. Pack them into an LMDB of ``TensorProtos`` (STRING image + INT32 label, keys ``str(j)``),
   as Caffe2's ``image_input_op_test.py`` does with the ``lmdb`` package.
3. Train a small CNN with ``Parallelize`` on 2 CPU devices; one ``CreateDB`` reader is shared
   by both devices' ``brew.image_input`` (scale 36, random 32x32 crops, mirror, mean/std),
   and ``StopGradient`` on the data, like resnet50_trainer's input builder.
4. Evaluate on held-out images with ``is_test=1`` (centre crops).

    python examples/image_training.py [--iters 60] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

import lmdb
import numpy as np
from PIL import Image

from dpgraph.compat import caffe2 as caffe2_alias

caffe2_alias.install()

from caffe2.proto import caffe2_pb2  # noqa: E402
from caffe2.python import (  # noqa: E402
    brew,
    data_parallel_model,
    model_helper,
    optimizer,
    workspace,
)

DEVICES, BATCH_PER_DEVICE, SIDE = 2, 16, 40


def make_jpegs(folder: str, count: int, seed: int) -> list[tuple[str, int]]:
    """Stripes images: label 0 = horizontal, 1 = vertical."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    files = []
    for j in range(count):
        label = j % 2
        period = int(rng.integers(4, 9))
        phase = (np.arange(SIDE) + int(rng.integers(period))) // (period // 2) % 2
        mask = np.tile(phase[:, None] if label == 0 else phase[None, :], (1, 1))
        mask = np.broadcast_to(mask, (SIDE, SIDE))
        low, high = rng.integers(0, 100, 3), rng.integers(156, 256, 3)
        pixels = np.where(mask[..., None] == 1, high, low).astype(np.uint8)
        path = os.path.join(folder, f"img_{j:04d}_{label}.jpg")
        Image.fromarray(pixels).save(path, quality=90)
        files.append((path, label))
    return files


def write_lmdb(path: str, files: list[tuple[str, int]]) -> None:
    env = lmdb.open(path, map_size=1 << 40)
    with env.begin(write=True) as txn:
        for j, (image_path, label) in enumerate(files):
            protos = caffe2_pb2.TensorProtos()
            image = protos.protos.add()
            image.data_type = caffe2_pb2.TensorProto.STRING
            image.dims.append(1)
            with open(image_path, "rb") as handle:
                image.string_data.append(handle.read())
            label_proto = protos.protos.add()
            label_proto.data_type = caffe2_pb2.TensorProto.INT32
            label_proto.int32_data.append(label)
            txn.put(str(j).encode("ascii"), protos.SerializeToString())
    env.close()


def cnn(model: Any, data: Any) -> Any:
    conv = brew.conv(model, data, "conv1", dim_in=3, dim_out=8, kernel=3, stride=2, pad=1)
    pool = brew.max_pool(model, brew.relu(model, conv, "relu1"), "pool1", kernel=2, stride=2)
    return brew.fc(model, pool, "fc", dim_in=8 * 8 * 8, dim_out=2)


def image_args(is_test: bool) -> dict[str, Any]:
    return dict(batch_size=BATCH_PER_DEVICE, mean=128.0, std=128.0, scale=36, crop=32,
                mirror=1, is_test=is_test, decode_threads=2)


def train(train_db: str, iters: int) -> Any:
    model = model_helper.ModelHelper(name="image_cnn")
    reader = model.CreateDB("reader", db=train_db, db_type="lmdb")

    def input_builder(m: Any) -> None:
        data, _ = brew.image_input(m, reader, ["data", "label"], **image_args(False))
        m.StopGradient(data, data)

    def forward(m: Any, loss_scale: float) -> list[Any]:
        softmax, loss = m.net.SoftmaxWithLoss([cnn(m, "data"), "label"], ["softmax", "loss"])
        brew.accuracy(m, [softmax, "label"], "accuracy")
        return [m.net.Scale(loss, "scaled_loss", scale=loss_scale)]

    data_parallel_model.Parallelize(
        model, input_builder, forward,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.05, momentum=0.9),
        devices=list(range(DEVICES)), cpu_device=True)
    data_parallel_model.RunInitNet(model)
    for step in range(iters):
        data_parallel_model.RunNet(model, 1)
        if step % 20 == 0 or step == iters - 1:
            print(f"iter {step:3d}  loss {float(workspace.FetchBlob('cpu_0/loss')):.3f}")
    return model


def evaluate(test_db: str, count: int) -> float:
    """Centre crops of the held-out images through the trained cpu_0 parameters."""
    model = model_helper.ModelHelper(name="image_eval", init_params=False)
    reader = model.CreateDB("test_reader", db=test_db, db_type="lmdb")
    args = {**image_args(True), "batch_size": count, "mirror": 0}
    brew.image_input(model, reader, ["eval_data", "eval_label"], **args)
    params = {"conv1_w", "conv1_b", "fc_w", "fc_b"}
    for name in params:
        workspace.FeedBlob(name, workspace.FetchBlob(f"cpu_0/{name}"))
    softmax = model.net.Softmax(cnn(model, "eval_data"), "eval_softmax")
    brew.accuracy(model, [softmax, "eval_label"], "eval_accuracy")
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    return float(workspace.FetchBlob("eval_accuracy"))


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="dpgraph_images_")
    train_files = make_jpegs(os.path.join(workdir, "train"), 256, seed=0)
    test_files = make_jpegs(os.path.join(workdir, "test"), 64, seed=1)
    write_lmdb(os.path.join(workdir, "train_lmdb"), train_files)
    write_lmdb(os.path.join(workdir, "test_lmdb"), test_files)
    print(f"wrote {len(train_files)} + {len(test_files)} JPEGs and their LMDBs in {workdir}")
    train(os.path.join(workdir, "train_lmdb"), args.iters)
    accuracy = evaluate(os.path.join(workdir, "test_lmdb"), len(test_files))
    print(f"held-out accuracy (is_test centre crops): {accuracy:.3f}")
    return accuracy


if __name__ == "__main__":
    sys.exit(0 if main() > 0.8 else 1)
