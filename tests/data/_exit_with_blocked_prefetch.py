"""Run as a script: ImageInput over a blobs-queue DB leaves its prefetch blocked on the
empty queue; the interpreter must still exit (tests/data/test_db_input.py)."""

import numpy as np

from dpgraph import core, workspace

init = core.Net("i")
q = init.CreateBlobsQueue([], "q", capacity=10)
r = init.CreateBlobsQueueDB([q], "r")
workspace.RunNetOnce(init)
# feed exactly one batch worth; the prefetch of the next batch then waits forever
import io

from PIL import Image

from dpgraph.proto import caffe2_pb2

buf = io.BytesIO(); Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, "PNG")
p = caffe2_pb2.TensorProtos(); im = p.protos.add(data_type=4); im.string_data.append(buf.getvalue()); p.protos.add(data_type=2, int32_data=[1])
for _ in range(2):
    workspace.FeedBlob("b", p.SerializeToString())
    workspace.RunOperatorOnce(core.CreateOperator("SafeEnqueueBlobs", ["q", "b"], ["b", "s"]))
net = core.Net("n"); net.ImageInput(["r"], ["d", "l"], batch_size=1, scale=8, crop=8, is_test=1)
workspace.CreateNet(net); workspace.RunNet(net)
print("ran; exiting")
