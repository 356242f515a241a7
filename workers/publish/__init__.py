"""Publishing versions from a trainer's ranks: what our trainer (:mod:`workers.trainer`) and a bring-your-own
trainer (:mod:`workers.integrations.hf_callback`) share.

``ranks`` (the ``torchrun`` process group and its small collectives), ``delta`` (every rank diffs, encodes and
uploads the rows it owns; rank 0 writes the manifest: :class:`~workers.publish.delta.RankPublisher`),
``snapshot`` (every rank writes the weight files of the parameters it owns). Imports no process
(``workers.actor``, ``workers.trainer``, ``workers.relay``): checked by ``lint-imports``.
"""
