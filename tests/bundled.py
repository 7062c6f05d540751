"""The bundled profiles' names, as the tests choose them (the code under test reads rules, never names)."""

VLLM_033 = "vllm-0.33"
VLLM_SEED = "vllm-seed"
VLLM_034 = "vllm-0.34"
VLLM_034_SHARDED_CACHE = "vllm-0.34-sharded-draft-cache"


def profile_for_tp(tp: int) -> str:
    """The default profile where it builds a sharder of ``tp`` ranks, else vllm-seed, which builds one of any
    group (vllm-0.33 and vllm-0.34 refuse a group of one: PRE-TP-SIZE)."""
    from shardspec.spec.profiles import DEFAULT_PROFILE, rules_of

    return DEFAULT_PROFILE if tp >= rules_of(DEFAULT_PROFILE).min_tp else VLLM_SEED
