"""Publish every optimizer step of *any* trainer as an Aurora version.

:class:`StepPublisher` is the small API: ``publish_step(model_or_state_dict, step)`` diffs the bf16 cast of
the weights against what it published last and publishes version ``step`` through the production path —
every rank uploads the segments of the rows it holds (:meth:`VersionPublisher.upload_part`, cut-through),
rank 0 writes the signed manifest (:meth:`VersionPublisher.publish_parts`) — plus a full snapshot every
``snapshot_every`` versions (and of version 0, the starting weights, which actors bootstrap from).
:class:`AuroraCallback` drives it from ``transformers.TrainerCallback.on_step_end`` (called once per
optimizer step, after gradient accumulation), so it works with ``Trainer`` and TRL's trainers alike.

Sharding. Each process publishes rows ``[start, stop)`` of every training tensor, split the way
``torch.chunk`` splits dim 0 (:func:`~aurora_store.codec.sharding.even_rows`): under FSDP2 those are the
rows its ``DTensor`` shard holds, so no parameter is gathered; a replicated parameter (DDP, or a single
process) is sliced the same way, so every process uploads a disjoint share. The process group is the one
``torchrun``/``accelerate`` set up (``WORLD_SIZE``); only rank 0 writes manifests.

Versions are consecutive (a delta's base is the previous version; catch-up relies on it): ``step`` must be
one more than the last published version. Resuming a run from a trainer checkpoint is not handled here —
start a fresh run (bucket prefix) instead; the publisher refuses a bucket that already holds versions.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.namesets import snapshot_layout
from aurora_store.codec.params import CodecParams
from aurora_store.codec.sharding import LocalRows, even_rows, rows_digest
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.config import TransferSettings
from aurora_store.errors import ConfigError, LayoutError
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.publisher import VersionPublisher, utc_now
from aurora_store.trust import Signer
from workers.publish.delta import PublishOutcome, RankPublisher
from workers.publish.ranks import Ranks
from workers.publish.snapshot import held_constants, write_sharded_snapshot


def model_files(model: Any, tokenizer: Any = None) -> dict[str, bytes]:
    """``config.json`` (+ generation config and tokenizer files when given): what a snapshot directory needs
    besides the weights so that vLLM and transformers can load it."""
    import copy
    import tempfile

    files: dict[str, bytes] = {}
    config = copy.deepcopy(model.config)
    if not getattr(config, "architectures", None):
        # A model built from a config has none; without it vLLM guesses (e.g. an embedding model).
        config.architectures = [type(model).__name__]
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        generation = getattr(model, "generation_config", None)
        if generation is not None:
            generation.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for path in Path(tmp).iterdir():
            if path.is_file():
                files[path.name] = path.read_bytes()
    return files


class StepPublisher:
    """Publishes successive policies of one run into one bucket (see the module docs).

    ``layout`` describes the model (``ModelLayout.from_config(model.config.to_dict())`` when built with
    :meth:`for_model`); ``signing_key`` is the trainer's Ed25519 key (a path or base64, as ``aurora keygen``
    writes it); ``extra_files`` go into every snapshot next to the weights (``config.json``, tokenizer);
    ``files_layout`` names the snapshot files' tensors (the names the engine's loader reads:
    :func:`~aurora_store.codec.namesets.snapshot_layout`, as :meth:`for_model` sets it). Published from a model,
    snapshots also carry the layout's engine-only constants as the model holds them (a router's bias buffer).
    """

    def __init__(self, bucket: str, layout: ModelLayout, *, run: str = "default", signing_key: str | None = None,
                 snapshot_every: int = 0, extra_files: Mapping[str, bytes] | None = None,
                 segment_bytes: int | None = None, ranks: Ranks | None = None,
                 settings: TransferSettings | None = None, files_layout: ModelLayout | None = None) -> None:
        if snapshot_every < 0:
            raise ConfigError(f"snapshot_every must be >= 0, got {snapshot_every}")
        self.layout = layout
        self.files_layout = files_layout
        self._constants: dict[str, torch.Tensor] = {}  # the model's engine-only constants, for snapshots
        self.run = run
        self.snapshot_every = snapshot_every
        self.extra_files = dict(extra_files or {})
        self.ranks = ranks or Ranks.from_env()
        self.settings = settings or TransferSettings.from_env()
        self.store = DeltaStore(open_bucket(bucket, create=True, settings=self.settings), self.settings)
        self.sign = Signer.load(signing_key) if signing_key and self.ranks.leader else None
        producer = {"run": run, "process": "trainer", "host": socket.gethostname(), "via": "aurora.hf_callback"}
        params = CodecParams(segment_bytes=segment_bytes) if segment_bytes else CodecParams()
        self.publisher = VersionPublisher(self.store, layout, params, self.settings.streams, producer=producer,
                                          sign=self.sign)
        self.rank_publisher = RankPublisher(self.ranks, self.publisher)
        self.version: int | None = None  # last published version (None before start)
        self.digest = WeightsDigest()
        self._published: dict[str, LocalRows] = {}

    @classmethod
    def for_model(cls, bucket: str, model: Any, *, tokenizer: Any = None, **kwargs: Any) -> StepPublisher:
        """A publisher whose layout and snapshot side files come from a transformers model (and tokenizer)."""
        config = model.config.to_dict()
        kwargs.setdefault("files_layout", snapshot_layout(config))
        return cls(bucket, ModelLayout.from_config(config),
                   extra_files={**model_files(model, tokenizer), **kwargs.pop("extra_files", {})}, **kwargs)

    # --- rows ------------------------------------------------------------------------------------

    def rows(self, model_or_state: Any) -> dict[str, LocalRows]:
        """This process's bf16 rows of every training tensor (see the module docs for which rows)."""
        if isinstance(model_or_state, torch.nn.Module):
            tensors: Mapping[str, torch.Tensor] = dict(model_or_state.named_parameters())
            # Refuse to publish part of a model: every trainable parameter must be in the layout.
            self.layout.check_coverage([n for n, p in model_or_state.named_parameters() if p.requires_grad],
                                       held=tensors)
            self._constants = held_constants(model_or_state, self.layout)
        elif isinstance(model_or_state, Mapping):
            tensors = model_or_state
        else:
            raise ConfigError(f"publish needs an nn.Module or a state dict, got {type(model_or_state).__name__}")
        missing = [n for n in self.layout.train_names if n not in tensors]
        if missing:
            raise LayoutError(f"the model lacks tensors of its layout: {missing[:8]}")
        out = {}
        for name in self.layout.train_names:
            local, start = _local_rows(tensors[name], self.ranks)
            out[name] = LocalRows(name, start, local.detach().to(torch.bfloat16).contiguous().cpu())
        return out

    def _sum_digest(self, rows: Mapping[str, LocalRows]) -> WeightsDigest:
        parts = self.ranks.gather(str(rows_digest(self.layout, rows)), "digest")
        total = None
        if parts is not None:
            total = WeightsDigest()
            for part in parts:
                total = total + WeightsDigest.parse(part)
        return WeightsDigest.parse(self.ranks.broadcast(str(total) if total is not None else None, "digest"))

    # --- publishing ------------------------------------------------------------------------------

    def start(self, model_or_state: Any) -> WeightsDigest:
        """Publish version 0 (the starting weights) as a snapshot, and the run info actors look for."""
        if self.version is not None:
            raise ConfigError(f"this publisher already started (at version {self.version})")
        existing = self.store.latest_version() if self.ranks.leader else None
        self.ranks.agree(None if existing is None else
                         f"{self.store.url} already holds versions up to {existing}: publish a new run into a "
                         "fresh bucket or prefix")
        rows = self.rows(model_or_state)
        digest = self._sum_digest(rows)
        if self.ranks.leader:
            self.store.put_run_info({"run": self.run, "home_region": "home", "source_bucket": self.store.url,
                                     "layout": self.layout.fingerprint, "created_at": utc_now()})
        self._snapshot(0, rows, digest)
        self._published, self.version, self.digest = rows, 0, digest
        return digest

    def publish_step(self, model_or_state: Any, step: int) -> PublishOutcome:
        """Publish the current weights as version ``step`` (= last version + 1; :meth:`start` published
        version 0). Returns the outcome (digest on every rank, the report on rank 0)."""
        if self.version is None:
            raise ConfigError("call start() with the starting weights before the first publish_step")
        if step != self.version + 1:
            raise ConfigError(f"versions are consecutive: expected step {self.version + 1}, got {step}")
        new = self.rows(model_or_state)
        outcome = self.rank_publisher.publish(step, self.version, self.digest, self._published, new)
        self._published, self.version, self.digest = new, step, outcome.digest
        if self.snapshot_every and step % self.snapshot_every == 0:
            self._snapshot(step, new, outcome.digest)
        return outcome

    def _snapshot(self, version: int, rows: Mapping[str, LocalRows], digest: WeightsDigest) -> None:
        write_sharded_snapshot(self.ranks, self.store, version, self.layout, rows, digest,
                               extra_files=self.extra_files if self.ranks.leader else None,
                               created_at=utc_now(), producer=self.publisher.producer, sign=self.sign,
                               files_layout=self.files_layout, constants=self._constants)

    def close(self) -> None:
        self.store.close()


def _local_rows(tensor: torch.Tensor, ranks: Ranks) -> tuple[torch.Tensor, int]:
    """``(rows this process publishes, first row)``: a dim-0 DTensor shard as it is, anything else sliced
    into the ``even_rows`` share of this rank."""
    rows = int(tensor.shape[0]) if tensor.dim() else 1
    start, stop = even_rows(rows, ranks.rank, ranks.world)
    from torch.distributed.tensor import DTensor, Shard

    if isinstance(tensor, DTensor):
        placements = tensor.placements
        if len(placements) != 1 or not isinstance(placements[0], Shard) or placements[0].dim != 0:
            raise LayoutError(f"only dim-0 FSDP shards are supported, got placements {placements}")
        local = tensor.to_local()
        if int(local.shape[0]) != stop - start:
            raise LayoutError(f"rank {ranks.rank} holds {local.shape[0]} rows, expected [{start}, {stop}) of {rows}")
        return local, start
    return (tensor[start:stop] if ranks.sharded else tensor), start


try:
    from transformers import TrainerCallback
except ImportError:  # the callback needs transformers; StepPublisher does not
    TrainerCallback = object  # type: ignore[assignment,misc]


class AuroraCallback(TrainerCallback):
    """``Trainer(..., callbacks=[AuroraCallback(bucket, ...)])``: version 0 at train start, version
    ``global_step`` after every optimizer step. Keyword arguments go to :class:`StepPublisher`."""

    def __init__(self, bucket: str, *, tokenizer: Any = None, **publisher_args: Any) -> None:
        self.bucket = bucket
        self.tokenizer = tokenizer
        self.publisher_args = publisher_args
        self.publisher: StepPublisher | None = None
        self.outcomes: list[PublishOutcome] = []

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if model is None:
            raise ConfigError("AuroraCallback needs the trainer to pass its model")
        tokenizer = self.tokenizer if self.tokenizer is not None else processing_class
        self.publisher = StepPublisher.for_model(self.bucket, model, tokenizer=tokenizer, **self.publisher_args)
        if state.global_step:
            raise ConfigError("AuroraCallback cannot resume a run (global_step > 0): start a fresh bucket")
        self.publisher.start(model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.publisher is None:
            raise ConfigError("AuroraCallback.on_step_end before on_train_begin")
        self.outcomes.append(self.publisher.publish_step(model, state.global_step))

    def on_train_end(self, args, state, control, **kwargs):
        if self.publisher is not None:
            self.publisher.close()
