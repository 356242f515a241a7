"""Publishing the policy, on every rank: the delta of this rank's rows (its segments announced as each is
durable), rank 0's manifest and ``staged`` announcement, the snapshots, and the digest checks that go with
them. Moves :class:`~workers.trainer.state.Progress` to each version it publishes."""

from __future__ import annotations

from collections.abc import Callable

from aurora_store.bus import ControlPlane, VersionEvent
from aurora_store.codec import ModelLayout
from aurora_store.codec.manifest import SegmentRef
from aurora_store.codec.sharding import LocalRows, rows_digest
from aurora_store.codec.weights_digest import ZERO, WeightsDigest
from aurora_store.errors import DigestMismatchError
from aurora_store.store import DeltaStore
from aurora_store.store.publisher import VersionPublisher, utc_now
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.trust import Signer
from workers.publish.delta import PublishOutcome, RankPublisher
from workers.publish.ranks import Ranks
from workers.publish.snapshot import held_constants, write_sharded_snapshot
from workers.trainer.cli import TrainerConfig
from workers.trainer.leader import Leader
from workers.trainer.policy import ShardedPolicy
from workers.trainer.state import Progress


class Publishing:
    def __init__(self, config: TrainerConfig, ranks: Ranks, store: DeltaStore, layout: ModelLayout,
                 publisher: VersionPublisher, segment_plane: ControlPlane, progress: Progress, leader: Leader | None,
                 *, side_files: Callable[[], dict[str, bytes]], sign: Signer | None,
                 files_layout: ModelLayout | None = None) -> None:
        self.config = config
        self.ranks = ranks
        self.store = store
        self.layout = layout
        self.files_layout = files_layout  # the names a snapshot's files hold (those the engine's loader reads)
        self.segment_plane = segment_plane  # every rank announces its own segments
        self.progress = progress
        self.leader = leader
        self.side_files = side_files  # config and tokenizer files of a snapshot (rank 0 writes them)
        self.sign = sign
        self.rank_publisher = RankPublisher(ranks, publisher, announce=self._announce_segment)
        self._publishing = 0  # version whose segments are being announced

    def _announce_segment(self, ref: SegmentRef) -> None:
        self.segment_plane.announce(VersionEvent("segment", self._publishing, self.config.region,
                                                 segment=ref.digest, size=ref.size))

    def sum_digest(self, rows: dict[str, LocalRows]) -> WeightsDigest:
        """From-scratch digest of published rows: every rank hashes its own, rank 0 adds them up, all learn it."""
        parts = self.ranks.gather(str(rows_digest(self.layout, rows)), "digest")
        total = sum((WeightsDigest.parse(p) for p in parts), ZERO) if parts is not None else None
        return WeightsDigest.parse(self.ranks.broadcast(str(total) if total is not None else None, "digest"))

    def digest_of(self, version: int) -> WeightsDigest:
        if version == self.progress.version:
            return self.progress.digest
        if version == 0:
            return WeightsDigest.parse(read_snapshot_manifest(self.store, 0).weights_digest)
        return WeightsDigest.parse(self.store.manifest(version).weights_digest)

    def publish(self, policy: ShardedPolicy, version: int) -> PublishOutcome:
        """Every rank uploads the delta of its rows; rank 0 writes the manifest and announces the version."""
        progress = self.progress
        new = policy.cast_rows_lazily()  # cast tensor by tensor as the encoder asks: no second bf16 copy
        self._publishing = version
        outcome = self.rank_publisher.publish(version, progress.version, progress.digest, policy.published, new)
        policy.refresh_published()  # the published rows become this version's, in place
        progress.version, progress.digest = version, outcome.digest
        if self.config.verify_published_digest:
            actual = self.sum_digest(policy.published)
            self.ranks.agree(None if actual == progress.digest else
                             f"version {version}: published rows hash to {actual} from scratch, the manifest says "
                             f"{progress.digest}", DigestMismatchError)
        if self.leader is not None:
            self.leader.announce_published(version, outcome)
        if self.config.snapshot_every and version % self.config.snapshot_every == 0:
            self.snapshot(policy, version)
        if self.leader is not None:
            self.leader.announce_state(progress)
        return outcome

    def snapshot(self, policy: ShardedPolicy, version: int) -> None:
        """Snapshot ``version`` (the published rows, at the progress's digest) unless the bucket has it."""
        exists = self.ranks.leader and version in self.store.snapshot_versions()
        if self.ranks.broadcast(exists, "snapshot_exists"):
            return
        digest = self.progress.digest
        write_sharded_snapshot(self.ranks, self.store, version, self.layout, policy.published, digest,
                               extra_files=self.side_files() if self.ranks.leader else None,
                               created_at=utc_now(), producer={"run": self.config.run}, sign=self.sign,
                               files_layout=self.files_layout, constants=held_constants(policy.model, self.layout))
        if self.leader is not None:
            self.leader.announce_snapshot(version, digest)
