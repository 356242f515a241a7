"""Aurora inside other people's stacks: a vLLM weight-transfer backend (:mod:`.vllm_backend`) and a
transformers/TRL trainer callback (:mod:`.hf_callback`)."""
