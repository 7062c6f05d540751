"""Memory layouts and logits dtypes of a case's inputs, as engines hand them over.

Engines pass views: a field sliced out of an interleaved buffer (``t[::2]``),
a slice starting past its storage's first element, the rows of a padded
allocation or a column slice of a wider one (two-dimensional tensors), logits
in bfloat16 or float16. The spec lets inputs be non-contiguous views and requires
implementations to read them by their strides, so a case may ask for any
input field to be laid out that way (``Case.layouts``). The values never
change; only where they sit in memory does. The bytes around a view hold
plausible but wrong data (the field's own values rotated by one), so an
implementation that reads a view as if it were contiguous, or from its
storage's start, gets wrong answers instead of errors.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

CONTIGUOUS, STRIDED, OFFSET = "contiguous", "strided", "offset"
# Views of a two-dimensional tensor only: its rows further apart than its width (the leading columns of a
# wider buffer, as a padded allocation gives), or its columns taken from the middle of a wider buffer (as
# slicing a fused output gives). Both keep unit strides along a row.
ROW_PADDED, COLUMN_SLICE = "row-padded", "column-slice"
LAYOUTS_2D = (ROW_PADDED, COLUMN_SLICE)
LAYOUTS = (CONTIGUOUS, STRIDED, OFFSET, *LAYOUTS_2D)
# Elements in front of an "offset" view: odd, so the view is misaligned too.
OFFSET_ELEMENTS = 3
# Extra elements of each row of the buffer a two-dimensional view is taken from (odd, as above); a
# column slice starts COLUMN_SLICE_START columns into its buffer's rows.
ROW_PADDING = 3
COLUMN_SLICE_START = 2

LOGITS_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

BATCH_TENSORS = (
    "idx_mapping",
    "expanded_idx_mapping",
    "expanded_local_pos",
    "query_start_loc",
    "seq_lens",
    "logits_indices",
    "cu_num_logits",
)
BATCH_ARRAYS = ("idx_mapping_np", "cu_num_logits_np", "num_draft_tokens_per_req")
# vLLM 0.33's batch fields (None in the other profiles): a CPU tensor and a host array. Kept apart from the
# two tuples above, which also say what the goldens encode.
PROFILE_BATCH_FIELDS = ("seq_lens_cpu_upper_bound", "num_admitted_draft_tokens")
# Every tensor of the local sampler output handed to gather_sampler_output.
LOCAL_OUTPUT = "local_output"
# The owner table (owner rule owner_table), a host array of shard_sampler_inputs' own.
OWNER_TABLE = "owner_table"
LAYOUT_FIELDS = BATCH_TENSORS + BATCH_ARRAYS + PROFILE_BATCH_FIELDS + ("grammar_bitmask", "logits_shard", LOCAL_OUTPUT)
LAYOUT_FIELDS += (OWNER_TABLE,)
# The fields with two-dimensional tensors (for local_output: those of its tensors that are).
FIELDS_2D = ("grammar_bitmask", "logits_shard", LOCAL_OUTPUT)


def check_case_layout(layouts: dict, logits_dtype: str) -> None:
    """Raise ValueError naming the first unknown field, layout or dtype."""
    for name, layout in layouts.items():
        if name not in LAYOUT_FIELDS:
            raise ValueError(f"layouts: unknown input field {name!r}; expected one of {', '.join(LAYOUT_FIELDS)}")
        if layout not in LAYOUTS:
            raise ValueError(f"layouts[{name!r}]: unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
        if layout in LAYOUTS_2D and name not in FIELDS_2D:
            raise ValueError(
                f"layouts[{name!r}]: {layout!r} is a view of a two-dimensional tensor; {name} is one-dimensional "
                f"(two-dimensional: {', '.join(FIELDS_2D)})"
            )
    if logits_dtype not in LOGITS_DTYPES:
        raise ValueError(f"logits_dtype: unknown dtype {logits_dtype!r}; expected one of {', '.join(LOGITS_DTYPES)}")


def logits_dtype_of(name: str) -> torch.dtype:
    return LOGITS_DTYPES[name]


def lay_out_tensor(tensor: torch.Tensor | None, layout: str) -> torch.Tensor | None:
    """The same values as ``tensor`` (shape, dtype, device) in a view of the given layout."""
    if tensor is None or layout == CONTIGUOUS:
        return tensor
    decoy = _decoy_tensor(tensor)
    if layout == STRIDED:
        # Every other element of the last dimension; the decoy fills the gaps.
        return torch.stack([tensor, decoy], dim=-1).flatten(-2)[..., ::2]
    if layout == OFFSET:
        flat = tensor.reshape(-1)
        prefix = decoy.reshape(-1)[:OFFSET_ELEMENTS]
        prefix = torch.cat([prefix, flat.new_zeros(OFFSET_ELEMENTS - prefix.numel())])
        buffer = torch.cat([prefix, flat])
        return buffer[OFFSET_ELEMENTS:].view(tensor.shape)
    if layout in LAYOUTS_2D:
        if tensor.dim() != 2:
            return tensor  # a local output's one-dimensional tensors stay as they are
        before = COLUMN_SLICE_START if layout == COLUMN_SLICE else 0
        rows, cols = tensor.shape
        # The decoy's columns, repeated as needed, fill the buffer's columns around the view.
        filler = decoy.repeat(1, -(-(before + ROW_PADDING) // max(cols, 1)) + 1)[:, : before + ROW_PADDING]
        if filler.shape[1] < before + ROW_PADDING:  # no columns to repeat
            filler = tensor.new_zeros(rows, before + ROW_PADDING)
        buffer = torch.cat([filler[:, :before], tensor, filler[:, before:]], dim=1)
        return buffer[:, before : before + cols]
    raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")


def lay_out_array(array: np.ndarray | None, layout: str) -> np.ndarray | None:
    """The host counterpart of :func:`lay_out_tensor` for 1-D numpy arrays."""
    if array is None or layout == CONTIGUOUS:
        return array
    decoy = np.roll(array, 1)
    if layout == STRIDED:
        buffer = np.empty(2 * array.shape[0], dtype=array.dtype)
        buffer[0::2], buffer[1::2] = array, decoy
        return buffer[::2]
    if layout == OFFSET:
        prefix = np.zeros(OFFSET_ELEMENTS, dtype=array.dtype)
        prefix[: min(OFFSET_ELEMENTS, decoy.shape[0])] = decoy[:OFFSET_ELEMENTS]
        return np.concatenate([prefix, array])[OFFSET_ELEMENTS:]
    raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")


def _decoy_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """Plausible wrong values: floats negated, integers rotated by one along the first dimension."""
    return -tensor if tensor.is_floating_point() else tensor.roll(1, dims=0)


def lay_out_batch(batch, layouts: dict):
    """``batch`` with each field named in ``layouts`` replaced by a view of that layout."""
    changes = {name: lay_out_tensor(getattr(batch, name), layouts[name]) for name in BATCH_TENSORS if name in layouts}
    changes.update(
        {name: lay_out_array(getattr(batch, name), layouts[name]) for name in BATCH_ARRAYS if name in layouts}
    )
    for name in (name for name in PROFILE_BATCH_FIELDS if name in layouts):
        value = getattr(batch, name)
        changes[name] = (
            lay_out_array(value, layouts[name])
            if isinstance(value, np.ndarray)
            else lay_out_tensor(value, layouts[name])
        )
    return replace(batch, **changes) if changes else batch


def lay_out_grammar(grammar, layouts: dict):
    if grammar is None or "grammar_bitmask" not in layouts:
        return grammar
    return replace(grammar, grammar_bitmask=lay_out_tensor(grammar.grammar_bitmask, layouts["grammar_bitmask"]))


def lay_out_sampler_output(output, layouts: dict):
    """Every tensor of a local sampler output in the ``local_output`` layout."""
    layout = layouts.get(LOCAL_OUTPUT, CONTIGUOUS)
    if output is None or layout == CONTIGUOUS:
        return output
    lp = output.logprobs_tensors  # a two-dimensional layout leaves the one-dimensional tensors contiguous
    if lp is not None:
        lp = lp._replace(
            logprob_token_ids=lay_out_tensor(lp.logprob_token_ids, layout),
            logprobs=lay_out_tensor(lp.logprobs, layout),
            selected_token_ranks=lay_out_tensor(lp.selected_token_ranks, layout),
            cu_num_generated_tokens_tensor=lay_out_tensor(lp.cu_num_generated_tokens_tensor, layout),
        )
    return replace(
        output,
        sampled_token_ids=lay_out_tensor(output.sampled_token_ids, layout),
        logprobs_tensors=lp,
        num_nans=lay_out_tensor(output.num_nans, layout),
        num_sampled=lay_out_tensor(output.num_sampled, layout),
        num_rejected=lay_out_tensor(output.num_rejected, layout),
    )
