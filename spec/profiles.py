"""The profiles of spec/index.yaml by name, without importing torch (the CLI reads them before a run
starts). A test keeps these in step with the index."""

VLLM_033 = "vllm-0.33"
VLLM_SEED = "vllm-seed"
PROFILES = (VLLM_033, VLLM_SEED)
DEFAULT_PROFILE = VLLM_033
