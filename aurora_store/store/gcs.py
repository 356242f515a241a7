"""A Google Cloud Storage bucket over gcsfs: ``gs://bucket/prefix``.

Create-only writes use ``ifGenerationMatch=0`` (gcsfs ``mode="create"``), which GCS evaluates atomically
and answers with 412 when the object exists. gcsfs is an optional dependency (``pip install
aurora-rl[gcs]``).
"""

from __future__ import annotations

import contextlib
from typing import Any

from aurora_store.errors import (
    BucketNotFoundError,
    ConfigError,
    ObjectExistsError,
    ObjectNotFoundError,
    StoreAuthError,
    StoreError,
    TransientStoreError,
)
from aurora_store.store.base import Bucket, Capabilities, check_key


class GCSBucket(Bucket):
    capabilities = Capabilities(atomic_create=True, remote=True)

    def __init__(self, bucket: str, prefix: str = "", *, check: bool = True, fs: Any = None, **options: Any) -> None:
        if fs is None:
            try:
                import gcsfs
            except ImportError:
                raise ConfigError("gs:// buckets need gcsfs: pip install 'aurora-rl[gcs]'") from None
            fs = gcsfs.GCSFileSystem(**options)
        self.fs = fs
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"gs://{bucket}/{self.prefix}".rstrip("/")
        if check:
            self._wrap("open bucket", None, lambda: self.fs.ls(bucket, detail=False))

    def _path(self, key: str) -> str:
        check_key(key)
        return "/".join(p for p in (self.bucket, self.prefix, key) if p)

    def _wrap(self, action: str, key: str | None, fn):
        where = f"gs://{self._path(key)}" if key else f"GCS bucket {self.bucket!r}"
        try:
            return fn()
        except FileExistsError:
            raise ObjectExistsError(f"{where} already exists") from None
        except FileNotFoundError:
            if key is None:
                raise BucketNotFoundError(f"GCS bucket {self.bucket!r} does not exist") from None
            raise ObjectNotFoundError(f"{where} does not exist") from None
        except PermissionError as exc:
            raise StoreAuthError(f"GCS rejected the credentials for bucket {self.bucket!r}: {exc}") from None
        except (TimeoutError, ConnectionError) as exc:
            raise TransientStoreError(f"{action} {where}: {exc}") from None
        except OSError as exc:
            raise StoreError(f"{action} {where}: {exc}") from None

    def get(self, key: str) -> bytes:
        return self._wrap("read", key, lambda: self.fs.cat_file(self._path(key)))

    def put(self, key: str, data: bytes) -> None:
        self._wrap("write", key, lambda: self.fs.pipe_file(self._path(key), data))

    def create(self, key: str, data: bytes) -> None:
        self._wrap("create", key, lambda: self.fs.pipe_file(self._path(key), data, mode="create"))

    def size(self, key: str) -> int:
        return int(self._wrap("stat", key, lambda: self.fs.info(self._path(key)))["size"])

    def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        root = "/".join(p for p in (self.bucket, self.prefix) if p)
        try:
            paths = self.fs.find(root)
        except FileNotFoundError:
            return []
        keys = (p[len(root) + 1:] for p in paths)
        return sorted(k for k in keys if k.startswith(prefix) and k > start_after)

    def delete(self, key: str) -> None:
        with contextlib.suppress(ObjectNotFoundError):
            self._wrap("delete", key, lambda: self.fs.rm_file(self._path(key)))
