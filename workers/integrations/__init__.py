"""Aurora inside other people's stacks: a transformers/TRL trainer callback (:mod:`.hf_callback`). The vLLM
weight-transfer backend lives with the rest of the vLLM seam, in :mod:`workers.vllm.backend`."""
