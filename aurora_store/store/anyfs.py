"""A bucket on any fsspec filesystem, for URL schemes Aurora has no backend of its own for (``hf://``,
``sftp://``, ``webdav://``, ``local://`` …): the registry falls back to it for every protocol fsspec knows.

Such a filesystem promises no atomic create-only write (fsspec's generic ``pipe_file(mode="create")`` checks,
then writes), so :attr:`FsspecBucket.capabilities` says ``atomic_create=False`` and publishing on it is refused
(:class:`~aurora_store.errors.CreateOnlyUnsupportedError`) unless the URL declares a single writer::

    hf://buckets/me/run-7?single_writer=true

— the operator's promise that exactly one process (the trainer for its bucket, a relay for its region's) writes
there; :meth:`create` then checks and writes. Backends whose filesystem does create atomically subclass
:class:`FsspecBucket` and say so (:mod:`aurora_store.store.azure`).

URL options other than ``single_writer`` go to the filesystem's constructor as strings (``true``/``false``
become booleans); credentials come from wherever the filesystem reads them (its environment variables, config
files), never from Aurora. The URL with all its options is :attr:`url`, so it reopens the same bucket.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from aurora_store.config import TransferSettings
from aurora_store.errors import (
    BucketNotFoundError,
    ConfigError,
    CreateOnlyUnsupportedError,
    ObjectExistsError,
    ObjectNotFoundError,
    StoreAuthError,
    StoreError,
    TransientStoreError,
)
from aurora_store.store.base import Bucket, Capabilities, check_key
from aurora_store.store.registry import BucketURL

T = TypeVar("T")

#: The URL option by which an operator declares that one process writes the bucket (read here, not by the fs).
SINGLE_WRITER = "single_writer"


def from_url(url: BucketURL, *, create: bool, settings: TransferSettings | None) -> FsspecBucket:
    """``scheme://…[?option=…&single_writer=true]`` for any protocol fsspec knows. ``create=True`` makes the
    root directory where the filesystem has directories."""
    import fsspec

    try:
        cls = fsspec.get_filesystem_class(url.scheme)
    except (ImportError, ValueError) as exc:  # a known protocol whose package is missing, or an unknown one
        raise ConfigError(f"cannot open {url.url}: {exc}") from None
    options = filesystem_options(url.query)
    single_writer = parse_flag(url.query.get(SINGLE_WRITER, "false"), SINGLE_WRITER, url.url)
    bare = url.url.split("?", 1)[0]
    root = cls._strip_protocol(bare)
    try:
        fs = cls(**options)
    except Exception as exc:  # constructors reject options in their own ways
        raise ConfigError(f"cannot open {url.url}: {type(exc).__name__}: {exc}") from None
    return FsspecBucket(fs, root, url=url.url, fsspec_root=bare, storage_options=options,
                        single_writer=single_writer, create=create)


def filesystem_options(query: Mapping[str, str]) -> dict[str, Any]:
    """The URL's options for the filesystem constructor: all but ``single_writer``, booleans as booleans, and
    no listings cache unless asked for (other processes write the bucket: a cached listing would be stale)."""
    options: dict[str, Any] = {}
    for key, value in query.items():
        if key == SINGLE_WRITER:
            continue
        options[key] = {"true": True, "false": False}.get(value.lower(), value)
    options.setdefault("use_listings_cache", False)
    return options


def parse_flag(value: str, name: str, url: str) -> bool:
    flag = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(value.lower())
    if flag is None:
        raise ConfigError(f"{name}={value!r} in {url}: expected true or false")
    return flag


class FsspecBucket(Bucket):
    """A bucket under ``root`` of an fsspec filesystem. Objects are files; a bare prefix is no object."""

    #: What the filesystem itself gives; an instance adds ``single_writer`` when the operator declared it.
    native: ClassVar[Capabilities] = Capabilities(atomic_create=False)

    def __init__(self, fs: Any, root: str, *, url: str, fsspec_root: str, storage_options: Mapping[str, Any],
                 single_writer: bool = False, create: bool = False, check: bool = True) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url
        self._fsspec_root = fsspec_root
        self._storage_options = dict(storage_options)
        self.capabilities = Capabilities(atomic_create=self.native.atomic_create, single_writer=single_writer)
        if create:
            self._wrap("create bucket", None, lambda: self.fs.makedirs(self.root, exist_ok=True))
        if check:
            self._check_bucket()

    def _check_bucket(self) -> None:
        if not self._wrap("open bucket", None, lambda: self.fs.exists(self.root)):
            raise BucketNotFoundError(f"{self.url} does not exist (create=True makes it)")

    def fsspec_url(self) -> tuple[str, dict[str, Any]]:
        return self._fsspec_root, dict(self._storage_options)

    def fsspec_filesystem(self) -> tuple[Any, str]:
        return self.fs, self.root

    def _path(self, key: str) -> str:
        check_key(key)
        return f"{self.root}/{key}" if self.root else key

    # --- errors ----------------------------------------------------------------------------------

    def _wrap(self, action: str, key: str | None, fn: Callable[[], T]) -> T:
        where = f"{self.url.split('?', 1)[0]}/{key}" if key is not None else self.url
        try:
            return fn()
        except StoreError:
            raise
        except FileExistsError:
            raise ObjectExistsError(f"{where} already exists") from None
        except FileNotFoundError:
            if key is None:
                raise BucketNotFoundError(f"{where} does not exist") from None
            raise ObjectNotFoundError(f"{where} does not exist") from None
        except PermissionError as exc:
            raise StoreAuthError(f"{where}: access denied: {exc}") from None
        except (TimeoutError, ConnectionError) as exc:
            raise TransientStoreError(f"{action} {where}: {exc}") from None
        except Exception as exc:
            translated = self._translate(exc, action, where, key)
            if translated is None:
                raise
            raise translated from None

    def _translate(self, exc: Exception, action: str, where: str, key: str | None) -> StoreError | None:
        """A filesystem's own exception as a typed error, or None to let it through. Subclasses know theirs."""
        if isinstance(exc, OSError):
            return StoreError(f"{action} {where}: {exc}")
        return None

    # --- the Bucket contract ---------------------------------------------------------------------

    def get(self, key: str, limit: int | None = None) -> bytes:
        path = self._path(key)
        if limit is None:
            return self._wrap("read", key, lambda: self.fs.cat_file(path))
        # A ranged read: at most limit + 1 bytes leave the server, whatever the object's size.
        return self._wrap("read", key, lambda: self._read_range(path, limit + 1))

    def _read_range(self, path: str, end: int) -> bytes:
        data: bytes = self.fs.cat_file(path, start=0, end=end)
        return data

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self._wrap("write", key, lambda: self._write(path, data))

    def _write(self, path: str, data: bytes) -> None:
        try:
            self.fs.pipe_file(path, data)
        except FileNotFoundError:
            # A filesystem with real directories (local, sftp): make the parent, once. Object stores never get
            # here, so they get no directory-marker objects.
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            self.fs.pipe_file(path, data)

    def create(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if self.capabilities.atomic_create:
            self._wrap("create", key, lambda: self._create_atomically(path, data))
        elif self.capabilities.single_writer:
            # Check, then write: enough only because the operator declared this process the only writer.
            if self.exists(key):
                raise ObjectExistsError(f"{self.url.split('?', 1)[0]}/{key} already exists")
            self.put(key, data)
        else:
            raise CreateOnlyUnsupportedError(
                f"{self.url}: {type(self.fs).__name__} has no atomic create-only write; add "
                f"{SINGLE_WRITER}=true to the URL if exactly one process writes this bucket")

    def _create_atomically(self, path: str, data: bytes) -> None:
        """One conditional write that fails with ``FileExistsError`` if ``path`` exists (subclasses)."""
        raise NotImplementedError

    def size(self, key: str) -> int:
        path = self._path(key)
        info = self._wrap("stat", key, lambda: self.fs.info(path))
        if info.get("type") != "file":  # a directory, or a bare prefix on an object store
            raise ObjectNotFoundError(f"{self.url.split('?', 1)[0]}/{key} does not exist")
        return int(info["size"])

    def modified(self, key: str) -> float | None:
        path = self._path(key)
        self.size(key)
        try:
            stamp = self._wrap("stat", key, lambda: self.fs.modified(path))
        except NotImplementedError:
            return None
        return float(stamp.timestamp())

    def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        # Walk only the directory that can hold the prefix.
        directory = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = f"{self.root}/{directory}".rstrip("/") if directory else self.root

        def find() -> list[str]:
            try:
                return list(self.fs.find(base))
            except FileNotFoundError:
                return []

        cut = len(self.root) + 1 if self.root else 0
        keys = (path[cut:] for path in self._wrap("list", None, find))
        return sorted(k for k in keys if k.startswith(prefix) and k > start_after)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(ObjectNotFoundError):
            self._wrap("delete", key, lambda: self.fs.rm_file(path))
