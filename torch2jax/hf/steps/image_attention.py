"""What SigLIP- and CLIP-style patch towers share, run over every image's patches at once: the patch embedding with
a position table resampled per patch, and the pre-norm encoder layers, where each patch attends to its own image's
patches only, through a mask from the patches' image ids (transformers runs each image apart, or over cu_seqlens),
with the tower's own projections, layer norms and MLPs."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

Rotate = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def resampled_patches(embeddings: torch.nn.Module, pixel_values: torch.Tensor, resample: torch.Tensor) -> torch.Tensor:
    """[P, width]: each patch embedded (`pixel_values` [M, group, patch_dim]) plus its position, its row of `resample`
    ([M, group, side^2] float32: its weight on every table row, as transformers' antialiased resize of the table to
    the image's grid gives it) times the side x side table, in float32."""
    weight = embeddings.patch_embedding.weight
    hidden = embeddings.patch_embedding(pixel_values.reshape(-1, pixel_values.shape[-1]).to(weight.dtype))
    table = embeddings.position_embedding.weight
    positions = resample.reshape(-1, resample.shape[-1]).float() @ table.float()
    return hidden + positions.to(table.dtype)


def image_mask(image_ids: torch.Tensor, group: int) -> torch.Tensor:
    """[1, 1, P, P] bool: patch i may attend to patch j when both are of one image (`image_ids` [M], one per group of
    `group` consecutive patches)."""
    ids = image_ids[:, None].expand(-1, group).reshape(-1)
    return (ids[:, None] == ids[None, :])[None, None]


def within_image_layers(layers: Iterable[torch.nn.Module], hidden: torch.Tensor, mask: torch.Tensor,
                        rotate: Rotate | None = None) -> torch.Tensor:
    """`hidden` [P, width] through each layer (layer_norm1, self_attn's q/k/v/out projections, layer_norm2, mlp),
    attention kept to `mask`; `rotate(q, k)` ([P, heads, head_dim] each) applies a tower's rotary positions."""
    for layer in layers:
        attn, n = layer.self_attn, hidden.shape[0]
        x = layer.layer_norm1(hidden)
        q, k, v = (proj(x).view(n, -1, attn.head_dim) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        if rotate is not None:
            q, k = rotate(q, k)
        q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))
        scale = attn.scaling if hasattr(attn, "scaling") else attn.scale
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        hidden = hidden + attn.out_proj(out[0].transpose(0, 1).reshape(n, -1))
        hidden = hidden + layer.mlp(layer.layer_norm2(hidden))
    return hidden
