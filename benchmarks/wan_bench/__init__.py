"""``python -m benchmarks wan``: Aurora's delivery paths over emulated cross-region links.

Built on the WAN-emulation harness (:mod:`benchmarks.wan`): a home and a remote network namespace joined
by a userspace-forwarded link (rate, RTT, random loss; cubic pinned on its routes), the real SeaweedFS S3 server
and Valkey in home, a regional S3 server, the real relay and the actors in remote. Five measurements:

1. full weights vs delta, time to deliver one version across a sweep of link rates;
2. one delta over 1 vs 2/4/8 streams at RTT 50 ms and 0.1 % / 1 % loss;
3. cut-through publishing vs encode-then-upload, publish start → remote actor staged, relay copying;
4. relay vs direct for four remote actors: cross-region bytes counted at the link, time until all have it;
5. end to end: mean step time of short real runs — full broadcast, deltas, and an ideal zero-cost link.

Modules: :mod:`.config` (sizes and shapes; ``--quick``), :mod:`.env` (topology, servers, agents, relays),
:mod:`.agent` (the in-namespace worker), :mod:`.model` (synthetic versions and seeded buckets), :mod:`.measure`
(parts 1–4), :mod:`.e2e` (part 5), :mod:`.plots`, :mod:`.runner` (the JSON document), :mod:`.cli`.
Needs root (network namespaces, TUN devices).
"""
