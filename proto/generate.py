"""Regenerate the Python code for proto/fedrl/v1/*.proto, or check it is in sync.

The .proto files import each other as "fedrl/v1/...", so protoc writes
`from fedrl.v1 import ...`; the installed package is `fedrl.proto.v1`, so those
imports are rewritten. Everything else is protoc's output, byte for byte.

    python proto/generate.py          # rewrite the committed files
    python proto/generate.py --check  # exit 1 and name the files that differ
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
PACKAGE_DIR = PROTO_ROOT / "fedrl" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
_IMPORT = re.compile(r"^from fedrl\.v1 import ", re.MULTILINE)


def generate(out_dir: Path) -> list[Path]:
    """Write the generated modules for every .proto into out_dir/fedrl/v1."""
    sources = sorted(PACKAGE_DIR.glob("*.proto"))
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(s.relative_to(PROTO_ROOT)) for s in sources),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the messages above")
    written = sorted(
        p for p in (out_dir / "fedrl" / "v1").iterdir() if p.name.endswith(GENERATED_SUFFIXES)
    )
    for path in written:
        path.write_text(_IMPORT.sub("from fedrl.proto.v1 import ", path.read_text()))
    return written


def differences() -> list[str]:
    """Names of generated files that are missing, stale or extra in the tree."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p.read_bytes() for p in generate(Path(tmp))}
    committed = {
        p.name: p.read_bytes() for p in PACKAGE_DIR.iterdir() if p.name.endswith(GENERATED_SUFFIXES)
    }
    return sorted(
        name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the tree is stale")
    check = parser.parse_args().check
    if check:
        stale = differences()
        if stale:
            print("generated code out of sync with the .proto files: " + ", ".join(stale))
            print("run `make proto` and commit the result")
            return 1
        print("generated code is in sync")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            (PACKAGE_DIR / path.name).write_bytes(path.read_bytes())
            print(f"wrote {(PACKAGE_DIR / path.name).relative_to(PROTO_ROOT.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
