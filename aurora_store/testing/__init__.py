"""Aurora's testing kit, shipped like ``zarr.testing``: what our tests use and yours can too.

* :mod:`.conformance` — :class:`BucketConformance`, the contract every bucket backend (a user's too) runs;
* :mod:`.targets` — :class:`WeightTargetConformance`, the contract every weight target (an engine's too) runs;
* :mod:`.layouts` — :func:`prove_layout`, a layout checked element for element against an engine's tensors;
* :mod:`.builders` — tiny layouts, random bf16 states, perturbed versions, encoded and published deltas;
* :mod:`.servers` — real local servers: Valkey (Redis), SeaweedFS (S3), the GCS emulator;
* :mod:`.children` — child processes that end with their starter, even one that is SIGKILLed.

Importing :mod:`.conformance` or :mod:`.targets` needs pytest; the rest needs only the package's own dependencies.
"""
