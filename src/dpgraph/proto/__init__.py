"""Caffe2's wire-compatible protobuf schema (``package caffe2``).

``dpgraph.proto.caffe2_pb2`` carries the short device-type aliases Caffe2 patched onto its
generated module (``CPU``, ``CUDA``, ``IDEEP``, ...), so ``caffe2_pb2.CUDA`` works here too.
"""

from dpgraph.proto import caffe2_pb2

_ALIASES = ("CPU", "CUDA", "MKLDNN", "OPENGL", "OPENCL", "IDEEP", "HIP",
            "COMPILE_TIME_MAX_DEVICE_TYPES")
for _alias in _ALIASES:
    setattr(caffe2_pb2, _alias, getattr(caffe2_pb2, "PROTO_" + _alias))

__all__ = ["caffe2_pb2"]
