"""Run as a script: ImageInput over a blobs-queue DB leaves its prefetch blocked on the
empty queue; the interpreter must still exit (tests/data/test_db_input.py)."""

import io

import numpy as np
from PIL import Image

from dpgraph import core, workspace
from dpgraph.proto import caffe2_pb2

init = core.Net("init")
queue = init.CreateBlobsQueue([], "queue", capacity=10)
init.CreateBlobsQueueDB([queue], "reader")  # timeout_secs 0: readers wait forever
workspace.RunNetOnce(init)

buffer = io.BytesIO()
Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buffer, "PNG")
record = caffe2_pb2.TensorProtos()
record.protos.add(data_type=caffe2_pb2.TensorProto.STRING).string_data.append(
    buffer.getvalue())
record.protos.add(data_type=caffe2_pb2.TensorProto.INT32, int32_data=[1])
for _ in range(2):
    workspace.FeedBlob("record", record.SerializeToString())
    workspace.RunOperatorOnce(core.CreateOperator(
        "SafeEnqueueBlobs", ["queue", "record"], ["record", "status"]))

net = core.Net("input")
net.ImageInput(["reader"], ["data", "label"], batch_size=1, scale=8, crop=8, is_test=1)
workspace.CreateNet(net)
workspace.RunNet(net)  # the prefetch of the next batch now waits on the empty queue
print("ran; exiting")
