"""A Google Cloud Storage bucket over gcsfs: ``gs://bucket/prefix``.

Create-only writes use ``ifGenerationMatch=0`` (gcsfs ``mode="create"``), which GCS evaluates atomically
and answers with 412 when the object exists. gcsfs is an optional dependency (``pip install
aurora-rl[gcs]``).

URL options (``gs://bucket/prefix?endpoint_url=…&token=anon``) are passed to gcsfs's ``GCSFileSystem``; an
``endpoint_url`` (an emulator, a private endpoint) and ``token=anon`` stay in :attr:`url`, so the URL reopens the
same bucket.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from aurora_store.config import TransferSettings
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
from aurora_store.store.registry import BucketURL

T = TypeVar("T")

# gcsfs's HttpError (what is left after its own retries) carries the HTTP status; it is not an OSError.
_AUTH_STATUSES = {401, 403}
_TRANSIENT_STATUSES = {408, 429, 500, 502, 503, 504}


def _http_errors() -> tuple[type[Exception], ...]:
    try:
        from gcsfs.retry import HttpError
    except ImportError:  # a caller-supplied fs without gcsfs installed
        return ()
    return (HttpError,)


def from_url(url: BucketURL, *, create: bool, settings: TransferSettings | None) -> GCSBucket:
    """``gs://bucket/prefix[?option=…]`` (also ``gcs://``): every option goes to gcsfs as given (a string).
    ``create`` is not honoured: buckets are provisioned by infrastructure."""
    if not url.netloc:
        raise ConfigError(f"GCS URL without a bucket name: {url.url}")
    options: dict[str, Any] = dict(url.query)  # strings, as given: gcsfs parses what it takes
    return GCSBucket(url.netloc, url.path, **options)


class GCSBucket(Bucket):
    capabilities = Capabilities(atomic_create=True)

    def __init__(self, bucket: str, prefix: str = "", *, check: bool = True, fs: Any = None, **options: Any) -> None:
        if fs is None:
            try:
                import gcsfs.core
            except ImportError:
                raise ConfigError("gs:// buckets need gcsfs: pip install 'aurora-rl[gcs]'") from None
            # The plain JSON-API filesystem, not ``gcsfs.GCSFileSystem``: recent gcsfs aliases that to its
            # experimental ExtendedGcsFileSystem, which first asks the gRPC storage-control API for every
            # bucket's layout and does not cache a failed answer (a 60 s stall per call against an emulator).
            # No listings cache: other processes write this bucket, and a cached listing would answer
            # size()/exists() with stale data.
            options.setdefault("use_listings_cache", False)
            fs = gcsfs.core.GCSFileSystem(**options)
        self.fs = fs
        self._options = dict(options)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        # Keep what locates the bucket and the anonymous mode (no secret) so that open_bucket(url) reopens it.
        kept = {"endpoint_url": options.get("endpoint_url"),
                "token": "anon" if options.get("token") == "anon" else None}
        query = "&".join(f"{k}={v}" for k, v in kept.items() if v)
        self.url = f"gs://{bucket}/{self.prefix}".rstrip("/") + (f"?{query}" if query else "")
        if check:
            self._wrap("open bucket", None, lambda: self.fs.ls(bucket, detail=False))

    def fsspec_url(self) -> tuple[str, dict[str, Any]]:
        return f"gs://{self.bucket}/{self.prefix}".rstrip("/"), dict(self._options)

    def fsspec_filesystem(self) -> tuple[Any, str]:
        # This bucket's own JSON-API filesystem (see __init__), not what fsspec maps gs:// to.
        return self.fs, "/".join(p for p in (self.bucket, self.prefix) if p)

    def _path(self, key: str) -> str:
        check_key(key)
        return "/".join(p for p in (self.bucket, self.prefix, key) if p)

    def _wrap(self, action: str, key: str | None, fn: Callable[[], T]) -> T:
        # key is None for bucket-level calls; "" is a key, and check_key (in _path) rejects it before any request.
        where = f"gs://{self._path(key)}" if key is not None else f"GCS bucket {self.bucket!r}"
        try:
            return fn()
        except StoreError:  # already typed (InvalidKeyError is also an OSError): keep it
            raise
        except FileExistsError:
            raise ObjectExistsError(f"{where} already exists") from None
        except FileNotFoundError:
            if key is None:
                raise BucketNotFoundError(f"GCS bucket {self.bucket!r} does not exist") from None
            raise ObjectNotFoundError(f"{where} does not exist") from None
        except PermissionError as exc:
            raise self._auth_error(exc) from None
        except (TimeoutError, ConnectionError) as exc:
            raise TransientStoreError(f"{action} {where}: {exc}") from None
        except OSError as exc:
            if str(exc).startswith("Forbidden:"):  # gcsfs reports 403 as a bare OSError("Forbidden: …")
                raise self._auth_error(exc) from None
            raise StoreError(f"{action} {where}: {exc}") from None
        except _http_errors() as exc:
            status = getattr(exc, "code", None)
            if status in _AUTH_STATUSES:
                raise self._auth_error(exc) from None
            if status in _TRANSIENT_STATUSES:
                raise TransientStoreError(f"{action} {where}: {exc}") from None
            raise StoreError(f"{action} {where}: {exc}") from None

    def _auth_error(self, exc: Exception) -> StoreAuthError:
        return StoreAuthError(f"GCS rejected the credentials for bucket {self.bucket!r}: {exc}")

    def get(self, key: str, limit: int | None = None) -> bytes:
        end = None if limit is None else limit + 1
        return self._wrap("read", key, lambda: self.fs.cat_file(self._path(key), start=0, end=end))

    def put(self, key: str, data: bytes) -> None:
        self._wrap("write", key, lambda: self.fs.pipe_file(self._path(key), data))

    def create(self, key: str, data: bytes) -> None:
        self._wrap("create", key, lambda: self.fs.pipe_file(self._path(key), data, mode="create"))

    def size(self, key: str) -> int:
        info = self._wrap("stat", key, lambda: self.fs.info(self._path(key)))
        # gcsfs answers info() on a bare prefix ("deltas" when "deltas/1" exists) with a size-0 directory;
        # in a flat namespace that is no object.
        if info.get("type") != "file":
            raise ObjectNotFoundError(f"gs://{self._path(key)} does not exist")
        return int(info["size"])

    def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        root = "/".join(p for p in (self.bucket, self.prefix) if p)

        def find() -> list[str]:
            try:
                # prefix= narrows the listing on the server (a poller reads only deltas/, not every segment).
                return self.fs.find(root, prefix=prefix)
            except FileNotFoundError:  # nothing under the prefix yet
                return []

        paths = self._wrap("list", None, find)
        keys = (p[len(root) + 1:] for p in paths)
        return sorted(k for k in keys if k.startswith(prefix) and k > start_after)

    def delete(self, key: str) -> None:
        with contextlib.suppress(ObjectNotFoundError):
            self._wrap("delete", key, lambda: self.fs.rm_file(self._path(key)))
