"""The bundled profiles' names, as the tests choose them (the code under test reads rules, never names)."""

VLLM_033 = "vllm-0.33"
VLLM_SEED = "vllm-seed"
VLLM_034 = "vllm-0.34"
VLLM_034_SHARDED_CACHE = "vllm-0.34-sharded-draft-cache"
