"""Generate dmq_pb2.py / dmq_pb2_grpc.py / dmq_pb2.pyi from dmq.proto.

`python -m dmq.proto.generate` writes them next to this file; `generate(out_dir)` is used by the
staleness test to compare a fresh generation with the committed files.
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import tempfile

PROTO_DIR = pathlib.Path(__file__).resolve().parent
GENERATED = ("dmq_pb2.py", "dmq_pb2_grpc.py", "dmq_pb2.pyi")


def generate(out_dir: pathlib.Path) -> None:
    import grpc_tools
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        # Map the folder to the import path dmq/proto so the stubs import `dmq.proto.dmq_pb2`.
        args = [
            "protoc",
            f"-I{include}",
            f"-Idmq/proto={PROTO_DIR}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            "dmq/proto/dmq.proto",
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed on dmq.proto")
        for name in GENERATED:
            shutil.copyfile(pathlib.Path(tmp) / "dmq" / "proto" / name, out_dir / name)


if __name__ == "__main__":
    generate(PROTO_DIR)
    print(f"generated {', '.join(GENERATED)} in {PROTO_DIR}", file=sys.stderr)
