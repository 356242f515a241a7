"""Aurora as a vLLM weight-transfer backend: ``weight_transfer_config={"backend": "aurora"}``.

vLLM (0.32) lets an RL stack move new weights into a running engine through a pluggable
``WeightTransferEngine`` that lives in every worker: ``LLM.init_weight_transfer_engine`` (once), then per
update ``start_weight_update`` / ``update_weights`` / ``finish_weight_update`` (the same calls exist on
``AsyncLLM`` and, with ``VLLM_SERVER_DEV_MODE=1``, as HTTP routes of ``vllm serve``). This module registers
:class:`AuroraWeightTransferEngine` under the name ``aurora`` through vLLM's general-plugin entry point
(``vllm.general_plugins`` → :func:`register`, declared in ``pyproject.toml``), so it is available in every
vLLM process once ``aurora-rl`` is installed. The same hook keeps CPU weights addressable
(:func:`keep_cpu_weights_addressable`).

Init info (``init_weight_transfer_engine({"init_info": {...}})``):

* ``bucket``: a bucket URL, or a list of them tried in order (e.g. the region's bucket fed by a relay, then
  the trainer's source bucket);
* ``run``: the run name the bucket must hold (its ``run.json``) and every signed manifest must name, so an
  engine never follows another run; required with ``trainer_public_key``;
* ``trainer_public_key``: the trainer's Ed25519 public key (base64 or a path); every manifest is verified
  before anything it names is fetched. ``None`` accepts unsigned runs (local experiments);
* ``version``: the published version the engine's loaded weights are (default 0, the run's first
  snapshot). The engine's weights are hashed from scratch and must equal that version's digest.

Update info (``update_weights({"update_info": {...}})``):

* ``version``: the version to activate (default: the newest in the bucket);
* ``base_version`` (optional): refuse unless the engine is at exactly this version;
* ``weights_digest`` (optional): refuse unless the target version's manifest carries this digest;
* push mode (``scatter``, see :meth:`AuroraWeightTransferEngine._push`): the whole update is validated
  before the first byte is written;
* ``check_full_digest`` (optional): after activating, hash the engine's weights from scratch and compare.

Each update follows the run through :class:`~aurora_store.follow.Follower`: the cheapest path by bytes (the
chain of deltas from the current version, or a snapshot plus the tail of the chain), then for every version: verify the
signed manifest, check base version and base digest against the engine, fetch and verify segments, decode,
check that the result's digest is the manifest's, and only then scatter the changed elements into vLLM's own
fused parameters in place (the same scatter core as the worker extension,
:func:`workers.vllm.worker.scatter_in_place`). Writes are O(changed elements); nothing full-shape is
allocated on the delta path. A version either lands whole or not at all; if a later version of a chain
fails, the engine stays at the last version that landed (still verified) and the error is raised.

KV blocks computed under older weights must not be reused: call ``llm.reset_prefix_cache()`` after
``finish_weight_update`` (vLLM's RL routes do this with ``/pause?clear_cache=true``).

Limits: pull mode follows at tensor parallelism 1 (push mode writes every rank's slice, with the shard
maths of :mod:`workers.vllm.shards`; our engine client also has every rank stage its own slice from the
bucket and write it on a version-only call, :mod:`workers.vllm.held`); the model's layout must be one
:class:`~aurora_store.codec.ModelLayout` describes (Qwen2/Qwen3/Llama-style decoders).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.manifest import DeltaManifest
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.config import TransferSettings
from aurora_store.errors import (
    BaseVersionMismatchError,
    ConfigError,
    DigestMismatchError,
    MessageError,
    StoreError,
    VersionNotFoundError,
)
from aurora_store.follow import BucketChain, Follower
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.snapshot_manifest import SnapshotManifest, read_snapshot_manifest
from aurora_store.trust import Verifier
from workers.vllm.wire import BACKEND_NAME, EXTENSION_PATH, check_updates, unpack_updates
from workers.vllm.worker import ModelTarget

log = logging.getLogger("aurora.vllm_backend")
#: Update records kept on the engine (for inspection; bounded over a long run).
RECORDS_KEPT = 64


def register() -> None:
    """The ``vllm.general_plugins`` entry point (``pyproject.toml``): vLLM calls it once in every one of its
    processes (engine core, workers) before any model is built. Registers the ``aurora`` backend and keeps
    CPU weights addressable for engines that use Aurora. Idempotent; engines we start call it too
    (:class:`~workers.vllm.engine.VllmEngine`), which covers an engine core in the caller's process."""
    register_backend()
    keep_cpu_weights_addressable()
    keep_kernel_scan_safe()


def keep_kernel_scan_safe() -> None:
    """Let vLLM's kernel rebinding scan the modules of a process that has loaded numba.

    At every worker's start (right after the general plugins, so after this hook) vLLM's CPU platform rebinds
    Triton kernels by walking every loaded module's namespace and calling ``vars(value).get(...)`` on each value
    that has a ``__dict__``. llvmlite, loaded with numba for the codec's host kernels, exposes its C library as
    ``llvmlite.binding.ffi.lib``, whose attribute lookup wraps *any* missing name as a C function — ``__dict__``
    included — so the scan dies with ``AttributeError`` and the engine never starts. An empty mapping under
    ``__dict__`` in that object's symbol cache (the first place its lookup looks) makes ``vars(lib)`` an empty
    dict and changes no symbol llvmlite or numba call. Nothing to do where llvmlite is not loaded."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    symbols = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(symbols, dict):
        symbols.setdefault("__dict__", {})


def engine_uses_aurora() -> bool:
    """Whether the vLLM engine being built (the current vLLM config) updates its weights through Aurora:
    either this worker extension or the ``aurora`` weight-transfer backend. Without a current config (model
    code called outside an engine) the answer is yes, as before the backend existed."""
    from vllm.config.vllm import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    if config is None:
        return True
    transfer = getattr(config, "weight_transfer_config", None)
    return (config.parallel_config.worker_extension_cls == EXTENSION_PATH
            or (transfer is not None and transfer.backend == BACKEND_NAME))


def keep_cpu_weights_addressable() -> None:
    """On vLLM's CPU backend, make unquantized linear layers (and the tied LM head) of engines that update
    weights through Aurora (:func:`engine_uses_aurora`) compute from their parameters instead of a repacked
    copy, so in-place writes reach the kernels; other engines in the same process keep vLLM's packed GEMM.
    Idempotent; a no-op on other platforms.

    Why here: vLLM decides how a layer computes (``dispatch_cpu_unquantized_gemm``, module-level in
    ``vllm.model_executor.layers.utils``, looked up at each call) while it builds the model inside each
    worker process, and offers no setting for it; its general-plugin hook (:func:`register`) is the one
    documented place that runs in every vLLM process before any model is built. Binding a layout checks
    the outcome (:func:`workers.vllm.worker.packed_layers`), so a worker without the plugin is refused, not
    silently stale."""
    from vllm.model_executor.layers import utils as layer_utils
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or getattr(layer_utils.dispatch_cpu_unquantized_gemm, "_aurora", False):
        return
    original = layer_utils.dispatch_cpu_unquantized_gemm

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if weight is None or weight.ndim != 2 or weight.is_meta or not engine_uses_aurora():
            original(layer, remove_weight)
            return
        # vLLM's own fallback path; keeps layer.weight. torch types Module.__setattr__ as Tensor | Module only,
        # but vLLM stores a callable in this attribute.
        layer.cpu_linear = torch.nn.functional.linear  # type: ignore[assignment]

    dispatch._aurora = True  # type: ignore[attr-defined]
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch


def register_backend() -> None:
    """Register the ``aurora`` weight-transfer backend with vLLM's factory (by module and class name, as
    vLLM's own backends are). Idempotent; :func:`register` calls it."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(BACKEND_NAME, __name__, AuroraWeightTransferEngine.__name__)
    except ValueError as exc:  # the factory's only way of saying so; anything else is a real error
        if "already registered" not in str(exc):
            raise


@dataclass
class AuroraInitInfo(WeightTransferInitInfo):
    bucket: str | list[str] | None = None
    layout: dict[str, Any] | None = None  # push mode (no bucket): the caller stages, the backend writes
    run: str | None = None
    trainer_public_key: str | None = None
    version: int | None = 0
    streams: int | None = None


@dataclass
class AuroraUpdateInfo(WeightTransferUpdateInfo):
    version: int | None = None
    base_version: int | None = None
    weights_digest: str | None = None
    check_full_digest: bool = False
    scatter: list[list[Any]] | None = None  # push mode: [name, index kind, index bytes, bits bytes] per tensor


@dataclass
class UpdateRecord:
    """What one ``update_weights`` call did (kept on the engine for inspection)."""

    version: int
    kind: str  # "none", "replay" or "snapshot"
    versions: tuple[int, ...]
    changed: int
    bucket: str
    stage_s: float = 0.0
    activate_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class AuroraWeightTransferEngine(WeightTransferEngine[AuroraInitInfo, AuroraUpdateInfo]):
    """Follows a published Aurora run inside a vLLM worker (see the module docs)."""

    init_info_cls = AuroraInitInfo
    update_info_cls = AuroraUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.stores: list[DeltaStore] = []
        self.verify: Verifier | None = None
        self.target: ModelTarget | None = None
        self.updates: list[UpdateRecord] = []

    # --- lifecycle -------------------------------------------------------------------------------

    def init_transfer_engine(self, init_info: AuroraInitInfo) -> None:
        from vllm.distributed.parallel_state import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        tp = (get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size())
        if init_info.bucket is None:
            self._init_push(init_info, tp)
            return
        urls = [init_info.bucket] if isinstance(init_info.bucket, str) else list(init_info.bucket)
        if not urls:
            raise ConfigError("the aurora backend needs at least one bucket URL")
        settings = TransferSettings.from_env()
        if init_info.streams:
            settings = settings.with_overrides(streams=init_info.streams)
        stores = [DeltaStore(open_bucket(url, settings=settings), settings) for url in urls]
        # With the run: one trainer key may sign several runs, and another run's validly signed versions
        # (copied into this run's bucket by anyone who can write it) must be refused.
        if init_info.trainer_public_key and not init_info.run:
            raise ConfigError("the aurora backend verifies signed manifests against their run: init_info['run'] "
                              "is required with init_info['trainer_public_key']")
        verify = Verifier.load(init_info.trainer_public_key, init_info.run) if init_info.trainer_public_key else None
        # The layout comes from a signed manifest of the starting version (its document is checked against
        # the manifest's fingerprint when read).
        version = init_info.version
        if version is None:
            raise ConfigError("the aurora backend follows a bucket from a version: init_info['version'] is None")
        store, manifest = self._first_manifest(stores, version, verify)
        if init_info.run is not None:
            run = (store.run_info() or {}).get("run")
            if run != init_info.run:
                raise ConfigError(f"{store.url} holds run {run!r}, not {init_info.run!r}")
        layout = store.layout(manifest.layout_fingerprint)
        if tp[1] != 1:  # every rank would stage on its own and read back only its slice of each tensor
            raise ConfigError(f"the aurora backend follows a bucket at tensor parallelism 1 only, not {tp[1]}; "
                              f"at higher TP stage outside and push the changes (update_info['scatter'])")
        target = ModelTarget.bind(layout, self.model, tp, version=init_info.version, what="the run's layout")
        if str(target.digest) != manifest.weights_digest:
            raise DigestMismatchError(f"the engine's weights hash to {target.digest}, version {init_info.version} "
                                      f"of {store.url} to {manifest.weights_digest}: load that version's snapshot")
        self.stores, self.verify, self.target = stores, verify, target
        log.info("aurora backend following %s from version %d", ", ".join(s.url for s in stores), init_info.version)

    def _init_push(self, init_info: AuroraInitInfo, tp: tuple[int, int]) -> None:
        """Push mode — what our actor uses: it stages versions itself (fetch, verify, decode, digest check,
        against this engine's weights read through the worker extension) while vLLM generates, and hands the
        backend only the changed elements to write (``update_info["scatter"]``)."""
        if init_info.layout is None:
            raise ConfigError("the aurora backend needs a bucket URL, or a layout in push mode")
        layout = ModelLayout.from_json(init_info.layout)
        target = ModelTarget.bind(layout, self.model, tp, version=init_info.version)
        self.stores, self.verify, self.target = [], None, target

    @staticmethod
    def _first_manifest(stores: list[DeltaStore], version: int, verify: Verifier | None):
        """The first store holding ``version`` (as a snapshot or a delta) and that manifest, verified."""
        errors = []
        for store in stores:
            manifest: SnapshotManifest | DeltaManifest
            try:
                if version in store.snapshot_versions():
                    manifest = read_snapshot_manifest(store, version)
                else:
                    manifest = store.manifest(version)
            except StoreError as exc:
                errors.append(f"{store.url}: {exc}")
                continue
            if verify is not None:
                verify(manifest)
            return store, manifest
        raise VersionNotFoundError(f"no bucket holds version {version}: {'; '.join(errors)}")

    def start_weight_update(self) -> None:
        self._bound()  # in-place updates need no reload lifecycle

    def finish_weight_update(self) -> None:
        self._bound()

    def shutdown(self) -> None:
        for store in self.stores:
            store.close()
        self.stores, self.target = [], None

    # --- updates ---------------------------------------------------------------------------------

    def _bound(self) -> ModelTarget:
        if self.target is None:
            raise ConfigError("the aurora backend is not initialised: call init_weight_transfer_engine first")
        return self.target

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class also synchronises the accelerator; our writes are synchronous index_put_ calls.
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def receive_weights(self, update_info: AuroraUpdateInfo) -> None:
        target = self._bound()
        _optional_version(update_info.base_version, "base_version")
        if update_info.scatter is not None:
            self._push(target, update_info)
            return
        if not self.stores:
            raise ConfigError("this aurora backend was initialised in push mode: updates must carry `scatter`")
        if update_info.base_version is not None and update_info.base_version != target.version:
            raise BaseVersionMismatchError(f"update expects the engine at version {update_info.base_version}, "
                                           f"it is at {target.version}")
        _optional_version(update_info.version, "version")
        if update_info.version is not None and target.version is not None and update_info.version < target.version:
            raise BaseVersionMismatchError(f"the engine is at version {target.version} and cannot go back to "
                                           f"{update_info.version}")
        errors: list[str] = []
        for store in self.stores:
            try:
                record = self._update_from(store, target, update_info)
            except (StoreError, VersionNotFoundError) as exc:
                # A bucket that lacks something (a relay behind, an outage): try the next one. Verification
                # failures (signature, digest, base) are not retried elsewhere — they are not transient.
                errors.append(f"{store.url}: {exc}")
                log.warning("aurora update from %s failed: %s", store.url, exc)
                continue
            self._record(record)
            return
        raise VersionNotFoundError(f"no bucket could provide the update: {'; '.join(errors)}")

    def _record(self, record: UpdateRecord) -> None:
        self.updates.append(record)
        del self.updates[:-RECORDS_KEPT]

    def _push(self, target: ModelTarget, info: AuroraUpdateInfo) -> None:
        """Write pre-staged changed elements. The caller staged them against this engine's exact weights and
        checked the resulting digest; ``version``, when given, is recorded so that later pull updates know
        where the engine is. The whole update — versions, digest, and every tensor's name, encoding, index
        order and bounds (:func:`workers.vllm.wire.check_updates`) — is validated before the first byte is
        written, so a malformed one leaves the weights, the version and the digest as they were."""
        if info.base_version is not None and info.base_version != target.version:
            raise BaseVersionMismatchError(f"update expects the engine at version {info.base_version}, "
                                           f"it is at {target.version}")
        version = _optional_version(info.version, "version")
        digest = WeightsDigest.parse(info.weights_digest) if info.weights_digest is not None else None
        updates = check_updates(target.layout, unpack_updates(info.scatter))
        t0 = time.perf_counter()
        changed = target.write(updates)
        target.version = version
        if digest is not None:
            target.digest = digest
        self._record(UpdateRecord(version if version is not None else -1, "push", (), changed, "",
                                  0.0, time.perf_counter() - t0))

    def _update_from(self, store: DeltaStore, target: ModelTarget, info: AuroraUpdateInfo) -> UpdateRecord:
        goal = info.version if info.version is not None else store.latest_version()
        if goal is None:
            raise VersionNotFoundError(f"{store.url} holds no versions")
        if info.weights_digest is not None:
            manifest = store.manifest(goal) if goal in store.versions() else read_snapshot_manifest(store, goal)
            if manifest.weights_digest != info.weights_digest:
                raise DigestMismatchError(f"version {goal} has digest {manifest.weights_digest}, the update "
                                          f"asked for {info.weights_digest}")
        follower = Follower(BucketChain(store), verify=self.verify)
        follower.attach(target)
        written = target.written
        report = follower.follow_to(goal)  # every write validated before the first; a failure leaves no version
        if info.check_full_digest and target.full_digest() != target.digest:
            target.version = None
            raise DigestMismatchError(f"the engine's weights do not hash to version {goal}'s digest {target.digest}")
        return UpdateRecord(goal, report.kind, tuple(step.version for step in report.steps), target.written - written,
                            store.url, report.stage_s, report.activate_s)


def _optional_version(value: object, field: str) -> int | None:
    """A version field of an update: absent, or a non-negative integer (a bool or a float is not one)."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise MessageError(f"update_info[{field!r}] must be a non-negative integer, not {value!r:.40}")
    return value
