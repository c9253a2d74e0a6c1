"""Regenerate ``metanet_pb2.py`` and ``predictor_consts_pb2.py`` (and ``.pyi`` stubs).

Run ``python -m dpgraph.proto.regenerate_meta`` with ``grpcio-tools`` installed.  As for
``caffe2_pb2`` (see :mod:`dpgraph.proto.regenerate`) the protobuf runtime pin is removed;
the generated top-level ``import caffe2_pb2`` is pointed at ``dpgraph.proto.caffe2_pb2`` so
``caffe2.proto`` is registered once, under the file name the dependency names.
"""

from __future__ import annotations

import re
import sys

from dpgraph.proto.regenerate import _VERSION_CHECK, HERE

PROTOS = ("metanet.proto", "predictor_consts.proto")


def regenerate() -> None:
    """Run protoc on the predictor protos and fix up the generated modules."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    status = protoc.main(["protoc", f"-I{HERE}", f"--python_out={HERE}",
                          f"--pyi_out={HERE}", *PROTOS])
    if status != 0:
        sys.exit(f"protoc failed with status {status}")
    for proto in PROTOS:
        for suffix in ("_pb2.py", "_pb2.pyi"):
            module = HERE / (proto[: -len(".proto")] + suffix)
            text = _VERSION_CHECK.sub("", module.read_text())
            text = re.sub(r"^import caffe2_pb2 as (\w+)$",
                          r"from dpgraph.proto import caffe2_pb2 as \1", text, flags=re.M)
            module.write_text(text)


if __name__ == "__main__":
    regenerate()
