"""``scripts/device-wheels``: wheels repacked with LZMA install exactly the files the originals do, and the run
reports its total against the carry limit (the download itself is ``pip download``, stood in for here)."""

from __future__ import annotations

import base64
import hashlib
import importlib.machinery
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def device_wheels():
    loader = importlib.machinery.SourceFileLoader("device_wheels", str(ROOT / "scripts" / "device-wheels"))
    spec = importlib.util.spec_from_loader("device_wheels", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(directory: Path) -> Path:
    """A small but real wheel: a package with a module and a compressible data file, metadata and RECORD."""
    files = {
        "tinypkg/__init__.py": b"import pathlib\n"
                               b"VALUE = len((pathlib.Path(__file__).parent / 'table.txt').read_text())\n",
        "tinypkg/table.txt": b"".join(b"row %06d %s\n" % (i, b"x" * (i % 50)) for i in range(20000)),
        "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\n"
                                       b"Tag: py3-none-any\n",
    }
    record = "\n".join([*(_record_line(n, d) for n, d in files.items()), "tinypkg-1.0.dist-info/RECORD,,"]) + "\n"
    path = directory / "tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("tinypkg-1.0.dist-info/RECORD", record)
    return path


#: What pip writes of its own on installing (where from, by whom), not the wheel's files.
PIP_WRITES = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD")


def _install(wheel: Path, target: Path) -> dict[str, bytes]:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, capture_output=True, timeout=120)
    return {str(p.relative_to(target)): p.read_bytes() for p in sorted(target.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and p.name not in PIP_WRITES}


def test_a_repacked_wheel_is_smaller_and_installs_the_same_files(device_wheels, tmp_path):
    original = build_wheel(tmp_path)
    packed = tmp_path / "packed" / original.name
    packed.parent.mkdir()
    device_wheels.repack_lzma(original, packed)
    assert packed.stat().st_size < original.stat().st_size
    with zipfile.ZipFile(packed) as wheel:
        assert {i.compress_type for i in wheel.infolist()} == {zipfile.ZIP_LZMA}
    installed = _install(packed, tmp_path / "from-packed")
    assert installed == _install(original, tmp_path / "from-original")
    assert set(installed) == {"tinypkg/__init__.py", "tinypkg/table.txt", "tinypkg-1.0.dist-info/METADATA",
                              "tinypkg-1.0.dist-info/WHEEL"}
    out = subprocess.run([sys.executable, "-c", "import tinypkg; print(tinypkg.VALUE)"], capture_output=True,
                         text=True, cwd=tmp_path / "from-packed", check=True)
    assert int(out.stdout) == len(installed["tinypkg/table.txt"].decode())


def test_the_run_reports_its_total_against_the_limit_and_drops_stale_wheels(device_wheels, tmp_path, monkeypatch,
                                                                             capsys):
    source = build_wheel(tmp_path)

    def fake_download(dest: Path) -> list[Path]:
        (dest / source.name).write_bytes(source.read_bytes())
        return [dest / source.name]

    monkeypatch.setattr(device_wheels, "download", fake_download)
    dest = tmp_path / "whl"
    dest.mkdir()
    (dest / "tinypkg-0.9-py3-none-any.whl").write_bytes(b"an older version")
    assert device_wheels.main(["--dest", str(dest)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["removed"] == ["tinypkg-0.9-py3-none-any.whl"]
    assert [p.name for p in dest.iterdir()] == [source.name]
    assert report["carried_bytes"] == (dest / source.name).stat().st_size < report["wheels"][0]["downloaded_bytes"]
    # over the limit: exit 1, the wheels kept for a look
    assert device_wheels.main(["--dest", str(dest), "--limit-mib", "0.001"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"] and report["limit_bytes"] == int(0.001 * 2**20) and (dest / source.name).exists()
