"""The wheel carries every subpackage, and the committed gRPC stubs match dmq.proto."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import zipfile

import pytest

pytestmark = pytest.mark.processes  # left out of `make check`

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = {"proto": "dmq.proto", "broker": "dmq.broker", "coordinator": "dmq.coordinator", "client": "dmq.client"}


def _source_modules() -> list[str]:
    names = []
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if "__main__" in parts:
                continue
            names.append(".".join([package, *parts]))
    return sorted(names)


def test_generated_stubs_are_fresh(tmp_path: pathlib.Path) -> None:
    from dmq.proto.generate import GENERATED, generate

    generate(tmp_path)
    for name in GENERATED:
        committed = (ROOT / "proto" / name).read_text()
        fresh = (tmp_path / name).read_text()
        assert committed == fresh, f"proto/{name} is stale: run `make proto` and commit the result"


@pytest.mark.slow
def test_wheel_contains_and_imports_every_module(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
    )
    # The distribution is dmq-queue ("dmq" on PyPI is another project); the import package is dmq.
    wheels = list(out.glob("dmq_queue-*.whl"))
    assert len(wheels) == 1, list(out.iterdir())
    with zipfile.ZipFile(wheels[0]) as zf:
        files = set(zf.namelist())
        metadata = next(zf.read(n).decode() for n in files if n.endswith(".dist-info/METADATA"))
        zf.extractall(tmp_path / "site")
    assert "\nName: dmq-queue\n" in metadata
    assert "\nProvides-Extra: spark\n" in metadata
    # PEP 561: every package of the namespace is marked typed, and the stubs of the generated code ship.
    for folder in FOLDERS:
        assert f"dmq/{folder}/py.typed" in files, f"dmq/{folder}/py.typed missing from the wheel"
    assert "dmq/proto/dmq_pb2.pyi" in files
    for module in _source_modules():
        path = module.replace(".", "/")
        assert f"{path}.py" in files or f"{path}/__init__.py" in files, f"{module} missing from the wheel"
    # Import every module from the unpacked wheel alone, not from the source tree.
    site = str(tmp_path / "site")
    code = (
        "import importlib, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "for m in sys.argv[2:]:\n"
        "    mod = importlib.import_module(m)\n"
        "    assert mod.__file__.startswith(sys.argv[1]), (m, mod.__file__)\n"
        "print('ok')"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", code, site, *_source_modules()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
