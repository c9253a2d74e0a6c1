# ruff: noqa: E402  (Caffe2 script style: the alias is installed before the imports)
"""One rank of a resnet50_trainer-style job: LMDB -> CreateDB(num_shards, shard_id) ->
brew.image_input -> Parallelize with a file-store rendezvous (Gloo) -> save with the
predictor exporter (rank 0) -> resume in a fresh workspace with load_from_db.

Usage: python _rendezvous_image_trainer.py <rank> <size> <lmdb> <file_store> <out.json>
"""

import json
import sys

import numpy as np

from dpgraph.compat import caffe2 as _alias

_alias.install()

from caffe2.proto import caffe2_pb2
from caffe2.python import brew, core, data_parallel_model, model_helper, optimizer, workspace
from caffe2.python.predictor import predictor_exporter as pred_exp
from caffe2.python.predictor import predictor_py_utils as pred_utils
from caffe2.python.predictor_constants import predictor_constants

RANK, SIZE, DB, STORE, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], \
    sys.argv[5]
BATCH, IMG = 4, 16


def rendezvous():
    workspace.RunOperatorOnce(core.CreateOperator(
        "FileStoreHandlerCreate", [], ["store_handler"], path=STORE, prefix="rdv"))
    return dict(kv_handler="store_handler", shard_id=RANK, num_shards=SIZE, engine="GLOO",
                transport="tcp", interface="", exit_nets=None)


def build(rdv):
    model = model_helper.ModelHelper(name="resnet_like")
    reader = model.CreateDB("reader", db=DB, db_type="lmdb", num_shards=SIZE, shard_id=RANK)

    def add_image_input(m):
        data, _ = brew.image_input(m, reader, ["data", "label"], batch_size=BATCH,
                                   output_type="float", use_gpu_transform=False,
                                   use_caffe_datum=False, mean=128.0, std=128.0, scale=20,
                                   crop=IMG, mirror=1, is_test=False)
        m.StopGradient(data, data)

    def forward(m, loss_scale):
        pool = brew.average_pool(m, "data", "pool", kernel=IMG)
        fc = brew.fc(m, pool, "fc", dim_in=3, dim_out=2)
        softmax, loss = m.net.SoftmaxWithLoss([fc, "label"], ["softmax", "loss"])
        return [m.net.Scale(loss, "scaled_loss", scale=loss_scale)]

    data_parallel_model.Parallelize(
        model, input_builder_fun=add_image_input, forward_pass_builder_fun=forward,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.1, policy="fixed"),
        devices=[0], rendezvous=rdv, cpu_device=True)
    return model


rdv = rendezvous()
model = build(rdv)
data_parallel_model.RunInitNet(model)
data_parallel_model.RunNet(model, 3)
labels = workspace.FetchBlob("cpu_0/label").tolist()
weights = workspace.FetchBlob("cpu_0/fc_w")
path = f"{STORE}/model_rank{RANK}.mdl"
meta = pred_exp.PredictorExportMeta(
    predict_net=model.net.Proto(), parameters=data_parallel_model.GetCheckpointParams(model),
    inputs=["cpu_0/data"], outputs=["cpu_0/softmax"])
pred_exp.save_to_db(db_type="minidb", db_destination=path, predictor_export_meta=meta)

workspace.ResetWorkspace()
resumed = build(rendezvous())
data_parallel_model.RunInitNet(resumed)
meta_net_def = pred_exp.load_from_db(path, "minidb")
init_net = core.Net(pred_utils.GetNet(meta_net_def, predictor_constants.GLOBAL_INIT_NET_TYPE))
predict_init_net = core.Net(pred_utils.GetNet(
    meta_net_def, predictor_constants.PREDICT_INIT_NET_TYPE))
workspace.RunNetOnce(predict_init_net)
workspace.RunNetOnce(init_net)
itercnt = workspace.FetchBlob("optimizer_iteration")
workspace.FeedBlob("optimizer_iteration", itercnt,
                   device_option=core.DeviceOption(caffe2_pb2.CPU, 0))
same = bool(np.array_equal(workspace.FetchBlob("cpu_0/fc_w"), weights))
data_parallel_model.FinalizeAfterCheckpoint(resumed)
data_parallel_model.RunNet(resumed, 1)
with open(OUT, "w") as handle:
    json.dump({"rank": RANK, "labels": labels, "iteration": int(itercnt[0]),
               "resumed_weights_equal": same, "weights": weights.reshape(-1).tolist(),
               "after": int(workspace.FetchBlob("optimizer_iteration")[0])}, handle)
print("done", RANK)
