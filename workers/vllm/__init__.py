"""Everything that runs inside or next to vLLM, one job per module:

* :mod:`.shards` — which elements of each tensor a tensor-parallel rank holds (pure maths, no vLLM);
* :mod:`.wire` — names and the bytes encoding shared by our client and vLLM's worker;
* :mod:`.worker` — inside the worker: the scatter core, the worker extension, the backend's weight target;
* :mod:`.held` — inside the worker: a version staged from the bucket into its own TP slice, held until activated;
* :mod:`.backend` — the ``aurora`` weight-transfer backend and its ``vllm.general_plugins`` hook;
* :mod:`.engine` — the engine client actors use (``--engine vllm``): ``VllmEngine``, ``VllmWeightTarget``.

Importing this package imports nothing from vLLM; only :mod:`.backend` needs vLLM to import.
"""
