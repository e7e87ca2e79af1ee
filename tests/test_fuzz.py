"""Property-based tests: arbitrary text, bytes and JSON never crash the parsers with anything but
the project's own error type."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from torch2jax.errors import ArtifactError, GraphFormatError, InputSpecError
from torch2jax.ir import input_specs as specs
from torch2jax.ir.graph import Graph
from torch2jax.runtime import artifact

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)

GRAPH_KEYS = ["format_version", "inputs", "nodes", "outputs", "in_spec", "out_spec", "symbols", "aliases", "subgraphs",
              "name", "kind", "op", "args", "kwargs", "meta", "ref", "dtype", "shape", "type", "children", "keys", "value"]
graph_like = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 3) | st.sampled_from(["x", "leaf", "dict", "user_input", "float32", "aten.add.Tensor"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(GRAPH_KEYS), children, max_size=5),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_input_spec_parser(text):
    try:
        specs.parse(text)
    except InputSpecError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[a-z]{1,3}=(float32|int64|bool|foo)\[[a-z0-9=,]{0,12}\](\(-?\d\.\.-?\d\))?", fullmatch=True))
def test_input_spec_parser_near_valid(text):
    try:
        spec = specs.parse(text)
    except InputSpecError:
        return
    assert spec.name and spec.dtype


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_graph_reader_bytes(data):
    try:
        Graph.loads(data)
    except GraphFormatError:
        pass


@settings(max_examples=400, deadline=None)
@given(graph_like)
def test_graph_reader_json(value):
    try:
        Graph.loads(json.dumps(value))
    except GraphFormatError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_manifest_reader(tmp_path, data):
    (tmp_path / "manifest.json").write_bytes(data)
    try:
        artifact.read_manifest(tmp_path)
    except ArtifactError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(extra=st.dictionaries(st.sampled_from(["files", "params", "inputs", "format_version"]), json_values, max_size=4))
@example(extra={"files": {"\x00": None}})  # a file name the OS cannot take: once a raw ValueError from resolve()
def test_manifest_reader_and_file_checks_near_valid(tmp_path, extra):
    manifest = {"format": artifact.FORMAT, "format_version": 1, "files": {}, "params": {"tree": {}}, "inputs": []}
    manifest.update(extra)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    try:
        checked = artifact.read_manifest(tmp_path)
        artifact.check_files(tmp_path, checked)
    except ArtifactError:
        pass
