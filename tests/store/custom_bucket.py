"""A bucket class that exists only in the tests — what a user of Aurora would write for their own storage.

``testfs:///abs/dir`` keeps every object as one file directly under ``dir/objects``, named by its key with every
``/`` and ``%`` percent-encoded (``deltas/000000000001.json`` → ``deltas%2F000000000001.json``): no directories per
prefix, so a bare prefix is never mistaken for an object, and listing is one ``scandir``. Writes are a temporary
file under ``dir/tmp`` (same filesystem) made visible atomically: ``rename(2)`` for a put, ``link(2)`` for a
create-only write — ``link`` fails with ``EEXIST`` when the name exists, so of racing creators exactly one wins,
which is what ``Capabilities(atomic_create=True)`` promises. Every process that opens the same URL sees the same
objects.

Aurora does not know this module: the tests register it under :data:`SCHEME` with ``register_bucket`` in-process,
and :func:`install_entry_point` gives the processes they start the same scheme through the
``aurora_store.buckets`` entry-point group.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from urllib.parse import quote, unquote

from aurora_store.config import TransferSettings
from aurora_store.errors import BucketNotFoundError, ConfigError, ObjectExistsError, ObjectNotFoundError, StoreError
from aurora_store.store import Bucket, BucketURL, Capabilities
from aurora_store.store.base import check_key

SCHEME = "testfs"
FACTORY = "tests.store.custom_bucket:from_url"
TESTS_ROOT = Path(__file__).resolve().parents[2]  # the directory holding the ``tests`` package


def from_url(url: BucketURL, *, create: bool, settings: TransferSettings | None) -> FlatDirBucket:
    """``testfs:///absolute/dir``: no host, no options."""
    if url.netloc or url.query or not url.path.startswith("/"):
        raise ConfigError(f"{SCHEME} URLs are {SCHEME}:///absolute/dir, without host or options: {url.url}")
    return FlatDirBucket(url.path, create=create)


class FlatDirBucket(Bucket):
    capabilities = Capabilities(atomic_create=True)

    def __init__(self, root: str | os.PathLike[str], *, create: bool = False) -> None:
        self.root = Path(root).absolute()
        self.url = f"{SCHEME}://{self.root}"
        self._objects, self._tmp = self.root / "objects", self.root / "tmp"
        if create:
            self._objects.mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(exist_ok=True)
        elif not (self._objects.is_dir() and self._tmp.is_dir()):
            raise BucketNotFoundError(f"no {SCHEME} bucket at {self.root}")

    def _file(self, key: str) -> Path:
        return self._objects / quote(check_key(key), safe="")

    def _staged(self, data: bytes) -> Path:
        tmp = self._tmp / uuid.uuid4().hex
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return tmp

    def get(self, key: str, limit: int | None = None) -> bytes:
        try:
            with open(self._file(key), "rb") as handle:
                return handle.read() if limit is None else handle.read(limit + 1)
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.url}/{key} does not exist") from None

    def put(self, key: str, data: bytes) -> None:
        path = self._file(key)
        try:
            os.replace(self._staged(data), path)
        except OSError as exc:
            raise StoreError(f"cannot write {self.url}/{key}: {exc}") from exc

    def create(self, key: str, data: bytes) -> None:
        path = self._file(key)
        try:
            tmp = self._staged(data)
        except OSError as exc:
            raise StoreError(f"cannot write {self.url}/{key}: {exc}") from exc
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise ObjectExistsError(f"{self.url}/{key} already exists") from None
        except OSError as exc:
            raise StoreError(f"cannot create {self.url}/{key}: {exc}") from exc
        finally:
            tmp.unlink()

    def size(self, key: str) -> int:
        try:
            return self._file(key).stat().st_size
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.url}/{key} does not exist") from None

    def modified(self, key: str) -> float | None:
        try:
            return self._file(key).stat().st_mtime  # a put renames a new file into place: a fresh mtime
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.url}/{key} does not exist") from None

    def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        with os.scandir(self._objects) as entries:
            keys = (unquote(entry.name) for entry in entries)
            return sorted(k for k in keys if k.startswith(prefix) and k > start_after)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._file(key).unlink()


def install_entry_point(site: Path, scheme: str = SCHEME, target: str = FACTORY, *,
                        distribution: str = "aurora_test_bucket") -> Path:
    """Make ``site`` an import path whose distribution ``distribution`` declares ``scheme`` in the
    ``aurora_store.buckets`` entry-point group — what ``pip install`` of a package with that entry point leaves in
    site-packages. Put ``site`` (and :data:`TESTS_ROOT`, so that ``target`` imports) on a process's ``PYTHONPATH``."""
    info = site / f"{distribution}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[aurora_store.buckets]\n{scheme} = {target}\n")
    return site


def pythonpath(site: Path) -> str:
    """A ``PYTHONPATH`` with ``site`` and the tests' root, ahead of whatever the environment already had."""
    return os.pathsep.join(p for p in (str(site), str(TESTS_ROOT), os.environ.get("PYTHONPATH")) if p)
