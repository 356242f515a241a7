"""An Azure Blob Storage container over adlfs: ``az://container/prefix`` (also ``abfs://``, ``abfss://``, and
``abfs://container@account.dfs.core.windows.net/prefix``).

Create-only writes are one Put Blob with ``If-None-Match: *`` (azure-storage-blob sends it for
``upload_blob(overwrite=False)``, which adlfs's ``pipe_file(mode="create")`` calls): the service answers 409
``BlobAlreadyExists`` (or 412) when the blob exists, so exactly one of several racing writers wins. adlfs is an
optional dependency (``pip install 'aurora-rl[azure]'``).

Credentials are adlfs's: ``AZURE_STORAGE_CONNECTION_STRING`` (also how an emulator such as Azurite is reached),
``AZURE_STORAGE_ACCOUNT_NAME`` with ``AZURE_STORAGE_ACCOUNT_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``, a service
principal, or ``DefaultAzureCredential`` (managed identity) — never the URL. The URL may name the account
(``?account_name=…``), which then stays in :attr:`url`.
"""

from __future__ import annotations

from typing import Any, ClassVar

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
from aurora_store.store.anyfs import FsspecBucket
from aurora_store.store.base import Capabilities
from aurora_store.store.registry import BucketURL

_URL_OPTIONS = {"account_name"}
_TRANSIENT_STATUSES = {408, 429, 500, 502, 503, 504}


def from_url(url: BucketURL, *, create: bool, settings: TransferSettings | None) -> AzureBucket:
    """``az://container/prefix[?account_name=…]``. ``create`` is not honoured: containers are provisioned by
    infrastructure, and a missing one is :class:`BucketNotFoundError`."""
    unknown = set(url.query) - _URL_OPTIONS
    if unknown:
        raise ConfigError(f"unknown Azure URL options {sorted(unknown)} in {url.url} (credentials come from the "
                          f"AZURE_STORAGE_* environment)")
    container, _, host = url.netloc.partition("@")
    if not container:
        raise ConfigError(f"Azure URL without a container name: {url.url}")
    account = url.query.get("account_name") or (host.split(".", 1)[0] if host else None)
    return AzureBucket(container, url.path, account_name=account)


class AzureBucket(FsspecBucket):
    native: ClassVar[Capabilities] = Capabilities(atomic_create=True)

    def __init__(self, container: str, prefix: str = "", *, account_name: str | None = None,
                 fs: Any = None, check: bool = True) -> None:
        options: dict[str, Any] = {"account_name": account_name} if account_name else {}
        if fs is None:
            try:
                import adlfs
            except ImportError:
                raise ConfigError("az:// buckets need adlfs: pip install 'aurora-rl[azure]'") from None
            # No listings cache: other processes write this container, and a cached listing would answer
            # size()/exists() with stale data.
            try:
                fs = adlfs.AzureBlobFileSystem(use_listings_cache=False, **options)
            except ValueError as exc:  # e.g. no account and no connection string
                raise ConfigError(f"cannot reach Azure container {container!r}: {exc}") from None
        self.container = container
        self.prefix = prefix.strip("/")
        root = "/".join(p for p in (container, self.prefix) if p)
        query = f"?account_name={account_name}" if account_name else ""
        super().__init__(fs, root, url=f"az://{root}{query}", fsspec_root=f"az://{root}", storage_options=options,
                         check=check)

    def _check_bucket(self) -> None:
        # The container must exist; a prefix inside it is created by the first write.
        from azure.core.exceptions import ResourceNotFoundError
        from fsspec.asyn import sync

        async def properties() -> None:
            # adlfs's own pattern: a short-lived client over the filesystem's shared service client.
            async with self.fs.service_client.get_container_client(self.container) as client:
                await client.get_container_properties()

        def probe() -> None:
            try:
                sync(self.fs.loop, properties)
            except ResourceNotFoundError:
                raise BucketNotFoundError(f"Azure container {self.container!r} does not exist") from None

        self._wrap("open bucket", None, probe)

    def _create_atomically(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data, mode="create")  # If-None-Match: *; adlfs raises FileExistsError on 409/412

    def _translate(self, exc: Exception, action: str, where: str, key: str | None) -> StoreError | None:
        from azure.core.exceptions import (
            ClientAuthenticationError,
            HttpResponseError,
            ResourceExistsError,
            ResourceNotFoundError,
            ServiceRequestError,
            ServiceResponseError,
        )

        if isinstance(exc, ClientAuthenticationError):
            return StoreAuthError(f"Azure rejected the credentials for container {self.container!r}: "
                                  f"{_first_line(exc)}")
        if isinstance(exc, ResourceExistsError):
            return ObjectExistsError(f"{where} already exists")
        if isinstance(exc, ResourceNotFoundError):
            if key is None or "ContainerNotFound" in str(exc):
                return BucketNotFoundError(f"Azure container {self.container!r} does not exist")
            return ObjectNotFoundError(f"{where} does not exist")
        if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
            return TransientStoreError(f"{action} {where}: {_first_line(exc)}")
        if isinstance(exc, HttpResponseError):
            status = exc.status_code or 0
            if status == 403:
                return StoreAuthError(f"Azure rejected the credentials for container {self.container!r}: "
                                      f"{_first_line(exc)}")
            if status in _TRANSIENT_STATUSES:
                return TransientStoreError(f"{action} {where}: {_first_line(exc)}")
            return StoreError(f"{action} {where}: {status} {_first_line(exc)}")
        return super()._translate(exc, action, where, key)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
