"""Sections 1 and 2 of SPEC.md: the overview with its worked example, and the data model."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import accumulate

from shardspec.spec.loader import FieldSpec, Spec, TypeSpec
from shardspec.spec.markdown import shape_text, table

STEPS = ("shard", "all_to_all", "gather", "step")
STEP_TITLES = {
    "shard": "shard (`shard_sampler_inputs`)",
    "all_to_all": "all_to_all (`all_to_all_logits`)",
    "gather": "gather (`gather_sampler_output`)",
    "step": "the whole step",
}


def render_overview(spec: Spec) -> list[str]:
    lines = ["## 1. Overview", ""]
    for title, body in spec.sections:
        lines += [f"### {title}", "", body, ""]
    return lines + render_example(spec.example)


def render_example(ex: dict) -> list[str]:
    tp, M, W = ex["tp"], ex["max_num_reqs_per_rank"], ex["max_num_logits_per_req"]
    cu = [0, *accumulate(ex["num_logits_per_req"])]
    qsl = ex["query_start_loc"]
    lines = [
        f"### {ex['title']}",
        "",
        f"A batch of {len(ex['slots'])} requests on tp = {tp} ranks, with speculative decoding "
        f"(L = {cu[-1]} logits rows).",
        "",
    ]
    lines += table(
        ["request i", "slot", "n_i", "query tokens", "logits rows", "logits_indices", "owner = slot mod tp"],
        [
            [
                i,
                slot,
                n,
                f"{qsl[i]}..{qsl[i + 1] - 1}",
                f"{cu[i]}..{cu[i + 1] - 1}",
                ex["logits_indices"][cu[i] : cu[i + 1]],
                ex["owners"][i],
            ]
            for i, (slot, n) in enumerate(zip(ex["slots"], ex["num_logits_per_req"], strict=False))
        ],
    )
    splits = ex["num_logits_per_rank"]
    starts = [0, *accumulate(splits)]
    lines += [
        f"- Owner-sorted requests: {ex['owner_sorted_reqs']}; `sorted_logits_indices` = {ex['sorted_logits_indices']}.",
        f"- `num_logits_per_rank` = {splits}: owner-sorted rows "
        + "; ".join(f"{starts[r]}..{starts[r + 1] - 1} go to rank {r}" for r in range(tp))
        + ".",
        "- After the all-to-all, rank r holds `[num_logits_per_rank[r], tp * Vs]`: "
        + ", ".join(f"rank {r} `[{splits[r]}, {tp} * Vs]`" for r in range(tp))
        + ".",
        f"- M = `max_num_reqs_per_rank` = {M}, W = `max_num_logits_per_req` = {W}; "
        f"`gathered_src_indices` = {ex['gathered_src_indices']}.",
        "",
        f"Sampled-output all-gather: each rank sends int64 `[M, W + 2 + g]` = `[{M}, {W + 2} + g]`; "
        f"gathered row `r * M + j` is rank r's row j.",
        "",
    ]
    lines += table(
        ["rank", "wire row j", "gathered row", "carries"],
        [
            [r, j, r * M + j, "padding" if req is None else f"request {req}"]
            for r, rows in enumerate(ex["wire_sampled_rows"])
            for j, req in enumerate(rows)
        ],
    )
    lines += [
        f"With logprobs, each rank sends `[M * W, C + 1]` int64 ids and `[M * W, C]` float32 values "
        f"({M * W} rows); row `j * W + p` is the p-th logits row of local request j.",
        "",
    ]
    lines += table(
        ["rank", f"wire rows 0..{M * W - 1}: (request, position) or pad"],
        [
            [r, ", ".join("pad" if item is None else f"({item[0]}, {item[1]})" for item in rows)]
            for r, rows in enumerate(ex["wire_logprob_rows"])
        ],
    )
    return lines


def render_data_model(spec: Spec) -> list[str]:
    model = spec.data_model
    lines = ["## 2. Data model", "", "### Symbols", ""]
    lines += table(["symbol", "meaning"], [[f"`{s.name}`", s.meaning] for s in model.symbols])
    lines += ["### Types", ""]
    for type_spec in model.types:
        lines += render_type(type_spec)
    lines += ["### Arguments of the operations", ""]
    lines += field_table(model.arguments, with_step=True)
    for arg in model.arguments:
        if arg.fields:
            lines += [f"`{arg.name}` fields:", ""] + field_table(arg.fields)
    lines += [
        "### Outputs by step",
        "",
        "Invariants name these outputs (and the sub-fields of expanded ones) in their `fields`.",
        "",
    ]
    for step in STEPS:
        outputs = [o for o in model.outputs if o.step == step]
        lines += [f"#### Step: {STEP_TITLES[step]}", ""] + field_table(outputs)
        for out in outputs:
            if out.layout:
                lines += [
                    f"- **`{out.name}`** — sent {_shape_and_dtype(out)}, received "
                    f"`{shape_text(out.received_shape)}`. {' '.join(out.layout.split())}"
                ]
        lines += [""] if any(o.layout for o in outputs) else []
    return lines


def _shape_and_dtype(spec: FieldSpec) -> str:
    return f"{spec.dtype} `{shape_text(spec.shape)}`"


def render_type(type_spec: TypeSpec) -> list[str]:
    python = f" (Python: `{type_spec.python}`)" if type_spec.python else ""
    lines = [f"#### {type_spec.name}{python}", "", type_spec.meaning, ""]
    if any(f.local for f in type_spec.fields):
        rows = [
            [f"`{f.name}`", _type_text(f), shape_text(f.shape), f.placement, _local_text(f), f.meaning]
            for f in type_spec.fields
        ]
        return lines + table(["field", "type", "shape", "placement", "local batch", "meaning"], rows)
    return lines + field_table(type_spec.fields)


def field_table(fields: Iterable[FieldSpec], with_step: bool = False) -> list[str]:
    header = ["field", "type", "shape", "placement", "meaning"]
    rows = []
    for f in fields:
        row = [f"`{f.name}`", _type_text(f), shape_text(f.shape), f.placement, f.meaning]
        rows.append([row[0], f.step, *row[1:]] if with_step else row)
    return table([header[0], "step", *header[1:]] if with_step else header, rows)


def _type_text(f: FieldSpec) -> str:
    text = f.ref if f.ref else (f"{f.type} {f.dtype}" if f.dtype else f.type)
    return f"{text} or None" if f.optional else text


def _local_text(f: FieldSpec) -> str:
    local = f.local
    parts = [local.scope]
    if local.dtype:
        parts.append(local.dtype)
    if local.shape:
        parts.append(shape_text(local.shape))
    text = " ".join(parts)
    return f"{text}; {local.note}" if local.note else text
