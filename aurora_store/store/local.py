"""A bucket in a local directory (``file://`` URLs and bare paths).

Writes go to a temporary file in the destination directory, are fsync'ed, and are then published
atomically: ``os.replace`` for overwrites, ``os.link`` for create-only writes (``link`` fails with
``EEXIST`` if the name exists, so two racing writers cannot both win — no check-then-write).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from pathlib import Path
from typing import Any

from aurora_store.config import TransferSettings
from aurora_store.errors import BucketNotFoundError, ConfigError, ObjectExistsError, ObjectNotFoundError, StoreError
from aurora_store.store.base import Bucket, Capabilities, check_key
from aurora_store.store.registry import BucketURL

_TMP_PREFIX = ".aurora-tmp-"


def from_url(url: BucketURL, *, create: bool, settings: TransferSettings | None) -> LocalBucket:
    """``file:///dir`` (``file://localhost/dir``), or a bare path, Windows drive paths included."""
    if url.scheme == "file" and url.netloc not in ("", "localhost"):
        raise ConfigError(f"file URLs must be local: {url.url}")
    return LocalBucket(url.path, create=create)


class LocalBucket(Bucket):
    capabilities = Capabilities(atomic_create=True)

    def __init__(self, root: str | os.PathLike[str], *, create: bool = False) -> None:
        self.root = Path(root).expanduser().absolute()
        self.url = self.root.as_uri()
        if self.root.exists() and not self.root.is_dir():
            raise BucketNotFoundError(f"{self.root} is a file, not a bucket directory")
        if create:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create bucket directory {self.root}: {exc}") from exc
        elif not self.root.is_dir():
            raise BucketNotFoundError(f"bucket directory {self.root} does not exist")

    def fsspec_url(self) -> tuple[str, dict[str, Any]]:
        return str(self.root), {}

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def get(self, key: str, limit: int | None = None) -> bytes:
        """Regular files inside the bucket only: a symlink (to ``/dev/zero``, or out of the bucket) or a FIFO
        (which would block ``open``) under an object's name is refused, not followed or waited on."""
        path = self._path(key)
        if not self._inside(path.parent):
            raise StoreError(f"{self.url}/{key} lies outside the bucket (a symlinked directory)")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.url}/{key} does not exist") from None
        except IsADirectoryError:
            raise ObjectNotFoundError(f"{self.url}/{key} is a directory, not an object") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreError(f"{self.url}/{key} is a symbolic link, not an object") from None
            raise StoreError(f"cannot read {self.url}/{key}: {exc}") from exc
        with os.fdopen(fd, "rb") as handle:
            st = os.fstat(handle.fileno())
            if stat.S_ISDIR(st.st_mode):
                raise ObjectNotFoundError(f"{self.url}/{key} is a directory, not an object")
            if not stat.S_ISREG(st.st_mode):
                raise StoreError(f"{self.url}/{key} is not a regular file")
            try:
                return handle.read(st.st_size if limit is None else min(st.st_size, limit + 1))
            except OSError as exc:
                raise StoreError(f"cannot read {self.url}/{key}: {exc}") from exc

    def _inside(self, directory: Path) -> bool:
        real_root = os.path.realpath(self.root)
        real = os.path.realpath(directory)
        return real == real_root or real.startswith(real_root + os.sep)

    def _write_temp(self, path: Path, data: bytes) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return tmp

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            tmp = self._write_temp(path, data)
            os.replace(tmp, path)
        except OSError as exc:
            raise StoreError(f"cannot write {self.url}/{key}: {exc}") from exc
        _fsync_dir(path.parent)

    def create(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            tmp = self._write_temp(path, data)
        except OSError as exc:
            raise StoreError(f"cannot write {self.url}/{key}: {exc}") from exc
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise ObjectExistsError(f"{self.url}/{key} already exists") from None
        except OSError as exc:
            raise StoreError(f"cannot create {self.url}/{key}: {exc}") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync_dir(path.parent)

    def size(self, key: str) -> int:
        path = self._path(key)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.url}/{key} does not exist") from None
        if not path.is_file():
            raise ObjectNotFoundError(f"{self.url}/{key} is not an object")
        return st.st_size

    def modified(self, key: str) -> float | None:
        path = self._path(key)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.url}/{key} does not exist") from None
        return st.st_mtime  # a put is a new file renamed into place: a fresh mtime, even for equal bytes

    def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        # Walk only the directory that can contain the prefix.
        directory = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if not directory.is_dir():
            return []
        keys = []
        for dirpath, _, filenames in os.walk(directory):
            for name in filenames:
                if name.startswith(_TMP_PREFIX):
                    continue
                key = os.path.relpath(os.path.join(dirpath, name), self.root).replace(os.sep, "/")
                if key.startswith(prefix) and key > start_after:
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()


def _fsync_dir(directory: Path) -> None:
    """Make a rename/link durable (best effort: not every filesystem supports fsync on directories)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
