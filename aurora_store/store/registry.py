"""Which code opens a bucket URL: a scheme → factory map, as fsspec's ``known_implementations``.

The built-in schemes are named by ``"module:attr"`` strings and imported on first use, so opening a local
bucket imports neither boto3 nor gcsfs. Another package adds a scheme in-process with :func:`register_bucket`,
or — so that every process of a run (trainer, relays, actors) opens it by URL — in its packaging metadata::

    [project.entry-points."aurora_store.buckets"]
    mystore = "my_package.bucket:from_url"     # mystore://… URLs

Entry points are read only when a URL names a scheme nobody registered in-process, and only that scheme's is
imported. A scheme with neither but which fsspec knows (``hf``, ``sftp``, ``webdav``, ``local`` …) opens with the
generic fsspec backend (:mod:`aurora_store.store.anyfs`), which refuses to publish without atomic create-only
writes unless the URL declares a single writer.

A factory is called as ``factory(url, create=…, settings=…)`` with the parsed :class:`BucketURL` and returns a
:class:`~aurora_store.store.base.Bucket`; it checks the URL itself (its options, a missing bucket name) and raises
:class:`~aurora_store.errors.ConfigError` for what it does not accept.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from types import MappingProxyType
from typing import Protocol, TypeAlias, cast
from urllib.parse import parse_qs, urlparse

from aurora_store import plugins
from aurora_store.config import TransferSettings
from aurora_store.errors import ConfigError
from aurora_store.store.base import Bucket

ENTRY_POINT_GROUP = "aurora_store.buckets"

# RFC 3986 scheme syntax, lower case (urlparse lowers what it reads), and at least two characters: a one-letter
# "scheme" is a Windows drive (``C:/runs``), which opens as a local path, so such a scheme could never be reached.
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]+\Z")


@dataclass(frozen=True)
class BucketURL:
    """A bucket URL split into what factories look at.

    ``scheme`` is lower case, ``""`` for a bare path (``runs/a``, ``/data/b``, ``C:\\runs``), whose ``path`` is
    then the URL exactly as given (a ``?`` or ``#`` in a directory name is part of it). ``query`` maps each
    option to its last value; options without a value are dropped.
    """

    url: str
    scheme: str
    netloc: str
    path: str
    query: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    @classmethod
    def parse(cls, url: str) -> BucketURL:
        if not url:
            raise ConfigError("empty bucket URL")
        try:
            parsed = urlparse(url)
        except ValueError as exc:  # e.g. an unbalanced "[" in the host
            raise ConfigError(f"malformed bucket URL {url!r}: {exc}") from None
        scheme = parsed.scheme.lower()
        if not scheme or (len(scheme) == 1 and url[1:3] in (":\\", ":/")):
            return cls(url, "", "", url)
        query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        return cls(url, scheme, parsed.netloc, parsed.path, MappingProxyType(query))


class BucketFactory(Protocol):
    def __call__(self, url: BucketURL, *, create: bool, settings: TransferSettings | None) -> Bucket: ...


#: A factory, or where to import it from: ``"package.module:attr"``.
FactorySpec: TypeAlias = BucketFactory | str

#: Bare paths open with the ``file`` scheme's factory.
_BARE_PATH_SCHEME = "file"

BUILTIN_SCHEMES: Mapping[str, str] = MappingProxyType({
    "file": "aurora_store.store.local:from_url",
    "memory": "aurora_store.store.memory:from_url",
    "s3": "aurora_store.store.s3:from_url",
    "gs": "aurora_store.store.gcs:from_url",
    "gcs": "aurora_store.store.gcs:from_url",
    "az": "aurora_store.store.azure:from_url",
    "abfs": "aurora_store.store.azure:from_url",
    "abfss": "aurora_store.store.azure:from_url",
})

#: Any other protocol fsspec knows opens here (named as a string: this module imports no backend).
FSSPEC_FALLBACK = "aurora_store.store.anyfs:from_url"


def fsspec_knows(scheme: str) -> bool:
    """Whether fsspec has (or names, to be installed) a filesystem for ``scheme``."""
    import fsspec

    return scheme in fsspec.available_protocols()


class BucketRegistry:
    """Scheme → factory. Process-wide through the module functions below; tests may build their own."""

    def __init__(self, builtins: Mapping[str, FactorySpec] = BUILTIN_SCHEMES,
                 entry_point_group: str = ENTRY_POINT_GROUP, fallback: FactorySpec | None = FSSPEC_FALLBACK) -> None:
        self._specs: dict[str, FactorySpec] = dict(builtins)
        self._fallback = fallback
        self._loaded: dict[str, BucketFactory] = {}
        self._group = entry_point_group
        # Reentrant: a factory's module may register schemes itself while it is being imported under the lock.
        self._lock = threading.RLock()

    def register(self, scheme: str, factory: FactorySpec, *, clobber: bool = False) -> None:
        """Open ``scheme://…`` URLs with ``factory``. Registering the same factory again is a no-op; replacing
        another (a builtin, an earlier registration, an installed entry point) needs ``clobber=True``."""
        scheme = _check_scheme(scheme)
        _check_factory(scheme, factory)
        with self._lock:
            current = self._specs.get(scheme)
            if current is None and not clobber:
                current = next((ep.value for ep in self._entry_points(scheme)), None)
            if current is not None and current != factory and not clobber:
                raise ConfigError(f"bucket scheme {scheme!r} is already registered ({_describe(current)}); "
                                  f"pass clobber=True to replace it")
            self._specs[scheme] = factory
            self._loaded.pop(scheme, None)

    def schemes(self) -> list[str]:
        """Every scheme that opens: builtins, registrations and installed entry points (not yet imported)."""
        with self._lock:
            names = set(self._specs)
        names.update(ep.name.lower() for ep in entry_points(group=self._group) if _SCHEME.match(ep.name.lower()))
        return sorted(names)

    def factory(self, scheme: str, *, url: str | None = None) -> BucketFactory:
        """The factory of ``scheme`` (``""``: bare paths), imported on first use; ``url`` only names the URL in
        the error for a scheme nobody registered."""
        scheme = scheme.lower() or _BARE_PATH_SCHEME
        with self._lock:
            loaded = self._loaded.get(scheme)
            if loaded is not None:
                return loaded
            spec = self._specs.get(scheme)
            if spec is None:
                # Looked up on every miss, not cached: a path added to sys.path later may bring the scheme.
                found = self._entry_points(scheme)
                if not found and self._fallback is not None and fsspec_knows(scheme):
                    # Not cached in _specs: registering the scheme later needs no clobber.
                    loaded = self._loaded[scheme] = _load(scheme, self._fallback)
                    return loaded
                if not found:
                    raise ConfigError(f"unsupported bucket URL scheme {scheme!r}{f' in {url}' if url else ''}; "
                                      f"known schemes: {', '.join(self.schemes())} (and bare paths), and any "
                                      f"fsspec protocol; others are added with aurora_store.store.register_bucket "
                                      f"or the {self._group!r} entry-point group")
                if len({ep.value for ep in found}) > 1:  # two installed packages claim it: neither is chosen
                    raise ConfigError(f"bucket scheme {scheme!r} has several {self._group!r} entry points: "
                                      f"{', '.join(sorted({ep.value for ep in found}))}; uninstall all but one")
                spec = self._specs[scheme] = f"{found[0].module}:{found[0].attr}"
            loaded = self._loaded[scheme] = _load(scheme, spec)
            return loaded

    def open(self, url: str, *, create: bool = False, settings: TransferSettings | None = None) -> Bucket:
        parsed = BucketURL.parse(url)
        return self.factory(parsed.scheme, url=url)(parsed, create=create, settings=settings)

    def _entry_points(self, scheme: str) -> list[EntryPoint]:
        # Entry-point names are matched case-insensitively, as URL schemes are.
        return [ep for ep in entry_points(group=self._group) if ep.name.lower() == scheme]


def _check_scheme(scheme: object) -> str:
    name = scheme.lower() if isinstance(scheme, str) else ""
    if not _SCHEME.match(name):
        raise ConfigError(f"{scheme!r} is not a bucket URL scheme: a letter, then letters, digits, '+', '-' or '.', "
                          f"at least two characters (one letter is a Windows drive)")
    return name


def _check_factory(scheme: str, factory: object) -> None:
    if isinstance(factory, str):
        if not plugins.TARGET.match(factory):
            raise ConfigError(f"bucket scheme {scheme!r}: {factory!r} is not a 'package.module:attr' string")
    elif not callable(factory):
        raise ConfigError(f"bucket scheme {scheme!r}: the factory must be callable or a 'package.module:attr' "
                          f"string, not {type(factory).__name__}")


def _load(scheme: str, spec: FactorySpec) -> BucketFactory:
    if not isinstance(spec, str):
        return spec
    # a callable taking (url, *, create, settings), as documented
    return cast(BucketFactory, plugins.resolve(spec, f"bucket scheme {scheme!r}"))


def _describe(spec: FactorySpec) -> str:
    return spec if isinstance(spec, str) else getattr(spec, "__qualname__", repr(spec))


_REGISTRY = BucketRegistry()


def register_bucket(scheme: str, factory: FactorySpec, *, clobber: bool = False) -> None:
    """Open ``scheme://…`` URLs in this process with ``factory``: a callable ``(url: BucketURL, *, create: bool,
    settings: TransferSettings | None) -> Bucket`` or a lazy ``"package.module:attr"`` string. Other processes
    find a scheme through the ``aurora_store.buckets`` entry-point group instead (see the module docstring).
    :class:`ConfigError` for a name that is no URL scheme, or one already taken (unless ``clobber=True``)."""
    _REGISTRY.register(scheme, factory, clobber=clobber)


def registered_schemes() -> list[str]:
    """Every scheme :func:`~aurora_store.store.open_bucket` opens in this process, sorted."""
    return _REGISTRY.schemes()


def open_url(url: str, *, create: bool = False, settings: TransferSettings | None = None) -> Bucket:
    return _REGISTRY.open(url, create=create, settings=settings)
