# ruff: noqa: E501
"""Known failures of the default OpInfo sweep, recorded from a run with their reasons: (opinfo id, dtype) -> reason.

Mostly non-core ops without a lowering yet (linalg decompositions, special functions). Each entry is
skipped in make test; remove an entry when its lowering lands (make test-ops-full shows the rest).
"""

KNOWN_FAILURES: dict[tuple[str, str], str] = {
    ('hash_tensor', 'bool'): "no lowering for aten.hash_tensor.default",
    ('hash_tensor', 'float32'): "no lowering for aten.hash_tensor.default",
    ('nn.functional.linear_cross_entropy.chunked', 'bfloat16'): "no lowering for torch_nn._linear_cross_entropy_batch_chunked.default",
    ('nn.functional.linear_cross_entropy.chunked', 'float32'): "no lowering for torch_nn._linear_cross_entropy_batch_chunked.default",
    ('nn.functional.linear_cross_entropy.chunked_none', 'float32'): "no lowering for torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default",
    ('resize_as_', 'bfloat16'): "no lowering for aten.resize.default",
    ('resize_as_', 'float32'): "no lowering for aten.resize.default",
}
