"""A hypothesis state machine for the version log: publish / race / retry / fetch / snapshot / catch-up,
checked against a simple model (a list of weight states)."""

from __future__ import annotations

import threading
import uuid

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from aurora_store.codec import ModelLayout, TensorTarget, digest_state
from aurora_store.codec.layout import bits_view
from aurora_store.errors import VersionExistsError
from aurora_store.follow import follow, plan_catch_up
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.store.snapshots import load_snapshot, write_snapshot
from aurora_store.testing.builders import publish

LAYOUT = ModelLayout.identity({"w": torch.zeros(64, dtype=torch.bfloat16), "b": torch.zeros(8, dtype=torch.bfloat16)})


def mutate(state, seed: int, fraction: float):
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in state.items():
        bits = bits_view(tensor).clone()
        mask = torch.rand(bits.shape, generator=gen) < fraction
        bits[mask] += 1
        out[name] = bits.view(torch.bfloat16).reshape(tensor.shape)
    return out


class VersionLog(RuleBasedStateMachine):
    @initialize(backend=st.sampled_from(["memory", "local"]))
    def setup(self, backend):
        import tempfile

        url = f"memory://{uuid.uuid4().hex}" if backend == "memory" else tempfile.mkdtemp(prefix="aurora-sm-")
        self.store = DeltaStore(open_bucket(url, create=True))
        self.states = [{"w": torch.zeros(64, dtype=torch.bfloat16), "b": torch.zeros(8, dtype=torch.bfloat16)}]
        write_snapshot(self.store, 0, self.states[0], LAYOUT, digest_state(LAYOUT, self.states[0]))
        self.snapshots = {0}

    @property
    def latest(self) -> int:
        return len(self.states) - 1

    @rule(seed=st.integers(0, 10**6), fraction=st.sampled_from([0.0, 0.05, 0.5, 1.0]))
    def publish_next(self, seed, fraction):
        new = mutate(self.states[-1], seed, fraction)
        publish(self.store, LAYOUT, self.states[-1], new, self.latest + 1,
                digest_state(LAYOUT, self.states[-1]), streams=2)
        self.states.append(new)

    @rule(seeds=st.lists(st.integers(0, 10**6), min_size=2, max_size=4, unique=True))
    def race_for_next_version(self, seeds):
        candidates = [mutate(self.states[-1], s, 0.1) for s in seeds]
        version, base_digest = self.latest + 1, digest_state(LAYOUT, self.states[-1])
        outcome: dict[int, object] = {}

        def writer(i):
            try:
                outcome[i] = publish(self.store, LAYOUT, self.states[-1], candidates[i], version, base_digest)
            except VersionExistsError as exc:
                outcome[i] = exc

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(len(seeds))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [i for i, r in outcome.items() if not isinstance(r, Exception)]
        distinct = {str(digest_state(LAYOUT, c)) for c in candidates}
        if len(distinct) == len(candidates):
            assert len(winners) == 1, outcome
        winner = self.store.manifest(version).weights_digest
        self.states.append(next(c for c in candidates if str(digest_state(LAYOUT, c)) == winner))

    @precondition(lambda self: self.latest >= 1)
    @rule()
    def retry_of_the_latest_publish_is_idempotent(self):
        self.store.publish_manifest(self.store.manifest(self.latest))

    @precondition(lambda self: self.latest >= 1)
    @rule()
    def republishing_a_different_delta_loses(self):
        other = mutate(self.states[-2], 12345, 0.3)
        if str(digest_state(LAYOUT, other)) == self.store.manifest(self.latest).weights_digest:
            return
        try:
            publish(self.store, LAYOUT, self.states[-2], other, self.latest, digest_state(LAYOUT, self.states[-2]))
        except VersionExistsError:
            return
        raise AssertionError("overwrote a published version")

    @rule()
    def snapshot_latest(self):
        if self.latest not in self.snapshots:
            write_snapshot(self.store, self.latest, self.states[-1], LAYOUT, digest_state(LAYOUT, self.states[-1]))
            self.snapshots.add(self.latest)

    @rule(data=st.data())
    def catch_up_from_anywhere(self, data):
        current = data.draw(st.one_of(st.none(), st.integers(0, self.latest)))
        plan = plan_catch_up(current, self.latest, {v: self.store.delta_bytes(v) for v in self.store.versions()},
                             {s: read_snapshot_manifest(self.store, s).total_bytes
                              for s in self.store.snapshot_versions()})
        if plan.snapshot is not None:
            state, _ = load_snapshot(self.store, plan.snapshot, LAYOUT)
            start = plan.snapshot
        else:
            state, start = {k: v.clone() for k, v in self.states[current].items()}, current
        target = TensorTarget.from_state(LAYOUT, state, version=start)
        follow(self.store, target, plan.target, snapshots=False)
        assert target.version == self.latest
        assert target.digest == digest_state(LAYOUT, self.states[-1]) == target.full_digest()

    @invariant()
    def listing_matches_the_model(self):
        assert self.store.versions() == list(range(1, self.latest + 1))
        assert self.store.latest_version() == self.latest
        assert sorted(self.store.snapshot_versions()) == sorted(self.snapshots)


TestVersionLog = VersionLog.TestCase
TestVersionLog.settings = settings(max_examples=25, stateful_step_count=12, deadline=None)
