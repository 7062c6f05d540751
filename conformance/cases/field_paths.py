"""The argument paths of a case's fields (spec/data_model.yaml's names): those of the local sampler output,
and those a name of ``Case.layouts`` lays out."""

from __future__ import annotations

# Case.layouts names -> argument paths (local_output: every tensor of the local sampler output).
_LAYOUT_PATHS = {
    "grammar_bitmask": "grammar.grammar_bitmask",
    "logits_shard": "logits_shard",
    "owner_table": "owner_table",
}
LOCAL_TENSORS = (
    "local_output.sampled_token_ids",
    "local_output.num_nans",
    "local_output.num_sampled",
    "local_output.num_rejected",
    "local_output.logprobs_tensors.logprob_token_ids",
    "local_output.logprobs_tensors.logprobs",
    "local_output.logprobs_tensors.selected_token_ranks",
)
CU_GENERATED_TENSOR = "local_output.logprobs_tensors.cu_num_generated_tokens_tensor"
EXPLICIT_OUTPUTS = {
    "sampled_token_ids": "local_output.sampled_token_ids",
    "num_sampled": "local_output.num_sampled",
    "num_rejected": "local_output.num_rejected",
    "num_nans": "local_output.num_nans",
    "logprob_token_ids": "local_output.logprobs_tensors.logprob_token_ids",
    "logprobs": "local_output.logprobs_tensors.logprobs",
    "selected_token_ranks": "local_output.logprobs_tensors.selected_token_ranks",
}


def local_tensors(case) -> list[str]:
    """The local output tensors some rank of ``case`` passes (the toy sampler's, or the explicit ones)."""
    if case.local_outputs == "toy":
        return [p for p in LOCAL_TENSORS if case.logprobs_dims is not None or ".logprobs_tensors." not in p]
    outputs = list(case.local_outputs.values())
    present = {path for name, path in EXPLICIT_OUTPUTS.items() if any(getattr(o, name) is not None for o in outputs)}
    if any(o.cu_num_generated_tokens_tensor is not None for o in outputs):
        present.add(CU_GENERATED_TENSOR)
    return [p for p in (*LOCAL_TENSORS, CU_GENERATED_TENSOR) if p in present]


def path_of_layout_name(name: str) -> list[str]:
    if name == "local_output":
        return [*LOCAL_TENSORS, CU_GENERATED_TENSOR]
    return [_LAYOUT_PATHS.get(name, f"batch.{name}")]
