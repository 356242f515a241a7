"""The operators' view of a deployment: checking and collecting buckets, live status, run-log exports, and
the data and plots behind the notebooks.

Modules (import the one you need; ``inspect``, ``plots`` and ``notebook`` need matplotlib, the rest do not):

* :mod:`~aurora_store.ops.verify` — ``verify_bucket`` → :class:`~aurora_store.ops.verify.VerifyReport`
* :mod:`~aurora_store.ops.gc` — ``plan_gc`` / ``collect_garbage`` → :class:`~aurora_store.ops.gc.GcReport`
* :mod:`~aurora_store.ops.status` — ``read_status`` → :class:`~aurora_store.ops.status.ClusterStatus`
* :mod:`~aurora_store.ops.runlog` — ``export_run_log`` (Redis run log → ``runlog/*.jsonl`` in the bucket)
* :mod:`~aurora_store.ops.inspect`, :mod:`~aurora_store.ops.plots`, :mod:`~aurora_store.ops.notebook` — notebooks
"""
