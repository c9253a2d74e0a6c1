"""Regenerate ``caffe2_pb2.py`` and ``caffe2_legacy_pb2.py`` (and ``.pyi`` stubs).

Run ``python -m dpgraph.proto.regenerate`` with ``grpcio-tools`` installed.  protoc stamps
the module with a check that the protobuf runtime is at least as new as protoc itself;
the module only uses the descriptor-pool builder API that protobuf has had since 4.21,
so that check is removed to keep every protobuf version the package allows importable.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = ("caffe2.proto", "caffe2_legacy.proto")
_VERSION_CHECK = re.compile(
    r"from google\.protobuf import runtime_version as _runtime_version\n"
    r"|_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)\n",
)


def regenerate() -> None:
    """Run protoc on the core protos and strip the runtime version pin."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    status = protoc.main(
        ["protoc", f"-I{HERE}", f"--python_out={HERE}", f"--pyi_out={HERE}", *PROTOS]
    )
    if status != 0:
        sys.exit(f"protoc failed with status {status}")
    for proto in PROTOS:
        module = HERE / (proto[: -len(".proto")] + "_pb2.py")
        module.write_text(_VERSION_CHECK.sub("", module.read_text()))


if __name__ == "__main__":
    regenerate()
