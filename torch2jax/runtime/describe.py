"""An artifact's manifest as lines a person reads: what `torch2jax inspect` prints. Reads the manifest alone, so it
describes any artifact (a model, or a generator's entry points and generation section) without loading it."""

from __future__ import annotations

import os


def describe(manifest: dict, where: str | os.PathLike) -> list[str]:
    """An artifact's manifest as lines a person reads: source, versions, platforms, the generation section (limits,
    cache and cross-attention state), each entry point's signature, and the params."""
    versions = manifest.get("versions", {})
    params = manifest["params"]
    lines = [
        f"artifact  {where}  (format {manifest['format_version']}, created {manifest.get('created')})",
        f"source    {manifest.get('source')}",
        "versions  " + ", ".join(f"{k} {v}" for k, v in versions.items() if v),
    ]
    vjp = f"   vjp order {manifest['vjp_order']}" if "vjp_order" in manifest else ""
    lines.append(f"platforms {', '.join(manifest.get('platforms', []))}{vjp}")
    if manifest.get("task"):
        lines.append(f"task      {manifest['task']}")
    generation = manifest.get("generation")
    if isinstance(generation, dict):
        lines += _generation_lines({**generation, "vision": manifest.get("vision")})
    entries = manifest.get("entries") if isinstance(manifest.get("entries"), dict) else {"": manifest}
    for name, entry in entries.items():
        if name:
            lines.append(f"entry     {name}")
        lines += _signature_lines(entry, indent="  " if name else "")
    if manifest.get("mutated_buffers"):
        lines.append(f"mutates   {', '.join(manifest['mutated_buffers'])}")
    lines.append(f"params    {params['count']:,} values, {params['bytes'] / 1e6:.2f} MB in {len(params['tree'])} tensors")
    quantized = params.get("quantization")
    if isinstance(quantized, dict) and quantized.get("stored_by") == "checkpoint":  # runtime/quantize.adopt_stored
        lines.append(f"quantized as the checkpoint stores them ({', '.join(quantized.get('formats', []))}): "
                     f"{len(quantized.get('params', []))} matmul weights, {quantized.get('bytes_before', 0) / 1e6:.2f} MB as "
                     f"floats -> {quantized.get('bytes_after', 0) / 1e6:.2f} MB (dequantized inside the function)")
    elif isinstance(quantized, dict):
        group = f", groups of {quantized['group_size']} input columns" if quantized.get("group_size") else ", one scale per row"
        how = ("int8 weights and int8-rounded input rows, int8 x int8 products" if quantized.get("scheme") == "int8-dynamic"
               else f"{quantized.get('scheme')} weight-only")
        lines.append(f"quantized {how}{group}: {len(quantized.get('params', []))} matmul weights, "
                     f"{quantized.get('bytes_before', 0) / 1e6:.2f} MB -> {quantized.get('bytes_after', 0) / 1e6:.2f} MB "
                     "(each with a `<name>_scale` param; dequantized inside the function)")
    for name, spec in list(params["tree"].items())[:20]:
        lines.append(f"  {name}: {spec['dtype']}{spec['shape']}")
    if len(params["tree"]) > 20:
        lines.append(f"  ... {len(params['tree']) - 20} more")
    lines += [f"  {alias} -> tied to {kept}" for alias, kept in params.get("aliases", {}).items()]
    return lines


def _generation_lines(generation: dict) -> list[str]:
    cache = generation.get("cache", {})
    lines = [
        f"generate  max_cache_len {generation.get('max_cache_len')}, max_batch {generation.get('max_batch')}, "
        f"vocab {generation.get('vocab_size')}, end tokens {generation.get('eos_token_ids')}, pad {generation.get('pad_token_id')}",
        f"kv cache  {len(cache.get('shapes', []))} {cache.get('dtype')} tensors of {cache.get('shapes', [[]])[0]} "
        "(state: allocated at load, donated to each step, never saved)",
    ]
    vision = generation.get("vision")
    if isinstance(vision, dict) and vision.get("spatial_merge_size"):
        merge = vision.get("spatial_merge_size")
        lines.append(f"images    variable resolution: {vision.get('pixel_shape')} flattened patches + image_grid_thw -> "
                     f"grid_t*grid_h*grid_w/{merge * merge} features of {vision.get('feature_size')} per image, "
                     f"at image token {vision.get('image_token_id')}")
    elif isinstance(vision, dict):
        lines.append(f"images    {vision.get('pixel_shape')} pixel values -> {vision.get('tokens_per_image')} features of "
                     f"{vision.get('feature_size')} per image, at image token {vision.get('image_token_id')}")
    cross = generation.get("cross")
    if isinstance(cross, dict):
        encoder = generation.get("encoder_input") or {}
        lines.append(f"encoder   reads {encoder.get('name')} {encoder.get('shape')}, max_source_len "
                     f"{generation.get('max_source_len')}; the decoder starts from {generation.get('decoder_start_token_id')}")
        lines.append(f"cross     {len(cross.get('shapes', []))} {cross.get('dtype')} tensors of {cross.get('shapes', [[]])[0]} "
                     "(state: computed by encode, read by each decode step, never saved)")
    return lines


def _signature_lines(entry: dict, indent: str) -> list[str]:
    lines = [f"{indent}inputs"]
    for item in entry.get("inputs", []):
        fixed = f" (fixed at conversion: {item['fixed']})" if "fixed" in item else ""
        lines.append(f"{indent}  {item['name']}: {item['dtype']}[{', '.join(map(str, item['shape']))}]{fixed}")
    for name, bounds in entry.get("symbols", {}).items():
        hi = "inf" if bounds.get("max") is None else bounds["max"]
        lines.append(f"{indent}  dim {name} in [{bounds.get('min')}, {hi}]")
    taken = entry.get("example_path") or []
    if taken:
        lines.append(f"{indent}  converted along the example inputs' path: {len(taken)} value(s) read from tensors, "
                     "checked on every call (other values are refused)")
        for item in taken[:8]:
            what = item["value"] if "value" in item else f"`{item.get('condition')}`"
            lines.append(f"{indent}    {what}" + (f" at {item['at']}" if item.get("at") else ""))
        if len(taken) > 8:
            lines.append(f"{indent}    ... and {len(taken) - 8} more (inspect --json)")
    lines.append(f"{indent}outputs")
    for item in entry.get("outputs", []):
        shape = "?" if item.get("shape") is None else ", ".join(map(str, item["shape"]))
        lines.append(f"{indent}  {item.get('name')}: {item.get('dtype')}[{shape}]")
    return lines
