# ruff: noqa: E402, F401, F523, I001, UP031, UP032  (Caffe2 script style, kept on purpose)
"""A trimmed copy of Caffe2's examples/resnet50_trainer.py CPU path (the same imports and
API calls, in the same order), run through the import alias by test_trainer_flow.py.

Usage: python _imagenet_trainer.py <file_store_path> <num_epochs> [load_model_path]
"""

import logging
import os
import sys

import numpy as np

from dpgraph.compat import caffe2 as _alias

_alias.install()

from caffe2.proto import caffe2_pb2  # noqa: E402
from caffe2.python import (  # noqa: E402
    brew,
    core,
    data_parallel_model,
    dyndep,
    experiment_util,
    model_helper,
    optimizer,
    timeout_guard,
    workspace,
)
import caffe2.python.models.resnet as resnet  # noqa: E402
import caffe2.python.models.shufflenet as shufflenet  # noqa: E402,F401
from caffe2.python.modeling.initializers import Initializer, PseudoFP16Initializer  # noqa
import caffe2.python.predictor.predictor_exporter as pred_exp  # noqa: E402
import caffe2.python.predictor.predictor_py_utils as pred_utils  # noqa: E402
from caffe2.python.predictor_constants import predictor_constants  # noqa: E402

logging.basicConfig()
log = logging.getLogger("Imagenet_trainer")
log.setLevel(logging.DEBUG)
dyndep.InitOpsLibrary('@/caffe2/caffe2/distributed:file_store_handler_ops')
dyndep.InitOpsLibrary('@/caffe2/caffe2/distributed:redis_store_handler_ops')

FILE_STORE, NUM_EPOCHS = sys.argv[1], int(sys.argv[2])
LOAD = sys.argv[3] if len(sys.argv) > 3 else None
NUM_DEVICES, BATCH, IMG, LABELS, CHANNELS = 2, 4, 32, 10, 3
EPOCH_SIZE = 8  # two iterations of the total batch


def AddNullInput(model, reader, batch_size, img_size, dtype):
    suffix = "_fp16" if dtype == "float16" else ""
    model.param_init_net.GaussianFill([], ["data" + suffix],
                                      shape=[batch_size, 3, img_size, img_size])
    model.param_init_net.ConstantFill([], ["label"], shape=[batch_size], value=1,
                                      dtype=core.DataType.INT32)


def SaveModel(train_model, epoch):
    prefix = "[]_{}".format(train_model._device_prefix, train_model._devices[0])
    predictor_export_meta = pred_exp.PredictorExportMeta(
        predict_net=train_model.net.Proto(),
        parameters=data_parallel_model.GetCheckpointParams(train_model),
        inputs=[prefix + "/data"], outputs=[prefix + "/softmax"],
        shapes={prefix + "/softmax": (1, LABELS), prefix + "/data": (CHANNELS, IMG, IMG)})
    model_path = "%s/%s_%d.mdl" % (FILE_STORE, "resnext_model", epoch)
    pred_exp.save_to_db(db_type="minidb", db_destination=model_path,
                        predictor_export_meta=predictor_export_meta, use_ideep=False)


def LoadModel(path, model):
    meta_net_def = pred_exp.load_from_db(path, 'minidb')
    init_net = core.Net(pred_utils.GetNet(meta_net_def, predictor_constants.GLOBAL_INIT_NET_TYPE))
    predict_init_net = core.Net(pred_utils.GetNet(
        meta_net_def, predictor_constants.PREDICT_INIT_NET_TYPE))
    assert workspace.RunNetOnce(predict_init_net)
    assert workspace.RunNetOnce(init_net)
    itercnt = workspace.FetchBlob("optimizer_iteration")
    workspace.FeedBlob("optimizer_iteration", itercnt,
                       device_option=core.DeviceOption(caffe2_pb2.CPU, 0))


def RunEpoch(epoch, train_model, explog):
    epoch_iters = int(EPOCH_SIZE / BATCH / 1)
    for i in range(epoch_iters):
        timeout = 600.0 if i == 0 else 60.0
        with timeout_guard.CompleteInTimeOrDie(timeout):
            workspace.RunNet(train_model.net.Proto().name)
    prefix = "{}_{}".format(train_model._device_prefix, train_model._devices[0])
    accuracy = workspace.FetchBlob(prefix + '/accuracy')
    loss = workspace.FetchBlob(prefix + '/loss')
    learning_rate = workspace.FetchBlob(
        data_parallel_model.GetLearningRateBlobNames(train_model)[0])
    explog.log(input_count=(epoch + 1) * epoch_iters * BATCH,
               batch_count=(i + epoch * epoch_iters),
               additional_values={'accuracy': accuracy, 'loss': loss,
                                  'learning_rate': learning_rate, 'epoch': epoch,
                                  'top1_test_accuracy': -1, 'top5_test_accuracy': -1})
    assert loss < 40, "Exploded gradients :("
    return epoch + 1


def Train():
    train_arg_scope = {'order': 'NCHW', 'use_cudnn': True, 'cudnn_exhaustive_search': True,
                       'ws_nbytes_limit': 64 * 1024 * 1024}
    train_model = model_helper.ModelHelper(name="resnext18", arg_scope=train_arg_scope)

    def create_resnext_model_ops(model, loss_scale):
        with brew.arg_scope([brew.conv, brew.fc], WeightInitializer=Initializer,
                            BiasInitializer=Initializer, enable_tensor_core=False,
                            float16_compute=False):
            pred = resnet.create_resnext(model, "data", num_input_channels=CHANNELS,
                                         num_labels=LABELS, num_layers=18, num_groups=1,
                                         num_width_per_group=8, no_bias=True, no_loss=True)
        softmax, loss = model.SoftmaxWithLoss([pred, 'label'], ['softmax', 'loss'])
        loss = model.Scale(loss, scale=loss_scale)
        brew.accuracy(model, [softmax, "label"], "accuracy", top_k=1)
        brew.accuracy(model, [softmax, "label"], "accuracy_top5", top_k=5)
        return [loss]

    def add_optimizer(model):
        stepsz = int(30 * EPOCH_SIZE / BATCH / 1)
        optimizer.add_weight_decay(model, 1e-4)
        return optimizer.build_multi_precision_sgd(model, 0.1, momentum=0.9, nesterov=1,
                                                   policy="step", stepsize=stepsz, gamma=0.1)

    def add_image_input(model):
        AddNullInput(model, None, batch_size=BATCH // NUM_DEVICES, img_size=IMG,
                     dtype="float")

    def add_post_sync_ops(model):
        for param_info in model.GetOptimizationParamInfo(model.GetParams()):
            if param_info.blob_copy is not None:
                model.param_init_net.HalfToFloat(
                    param_info.blob, param_info.blob_copy[core.DataType.FLOAT])

    data_parallel_model.Parallelize(
        train_model, input_builder_fun=add_image_input,
        forward_pass_builder_fun=create_resnext_model_ops, optimizer_builder_fun=add_optimizer,
        post_sync_builder_fun=add_post_sync_ops, devices=list(range(NUM_DEVICES)),
        rendezvous=None, optimize_gradient_memory=False, use_nccl=False, cpu_device=True,
        ideep=False, shared_model=True, combine_spatial_bn=True)
    data_parallel_model.OptimizeGradientMemory(train_model, {}, set(), False)
    workspace.RunNetOnce(train_model.param_init_net)
    workspace.CreateNet(train_model.net)
    epoch = 0
    if LOAD is not None:
        LoadModel(LOAD, train_model)
        data_parallel_model.FinalizeAfterCheckpoint(train_model)
        epoch = int(LOAD.split("_")[-1].replace(".mdl", ""))
    expname = "%s_gpu%d_b%d_L%d_lr%.2f_v2" % ("resnext18", NUM_DEVICES, BATCH, LABELS, 0.1)
    explog = experiment_util.ModelTrainerLog(expname, {"num_epochs": NUM_EPOCHS})
    while epoch < NUM_EPOCHS:
        epoch = RunEpoch(epoch, train_model, explog)
        SaveModel(train_model, epoch)
        prev = "%s/%s_%d.mdl" % (FILE_STORE, "resnext_model", epoch - 1)
        if os.path.exists(prev):
            os.remove(prev)
    np.save(os.path.join(FILE_STORE, "iteration.npy"),
            workspace.FetchBlob("optimizer_iteration"))
    print("final loss", workspace.FetchBlob("cpu_0/loss"))


if __name__ == "__main__":
    workspace.GlobalInit(['caffe2', '--caffe2_log_level=2'])
    Train()
