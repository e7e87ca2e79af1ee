"""The step converters: a transformers model wrapped as the steps a generator runs, each traced once and lowered.

causal_lm.py (a causal LM's step over an explicit KV cache, served as prefill and decode), seq2seq.py (an
encoder-decoder's encode and decode steps), vision_language.py (an image encoder and the causal-LM step over
embeddings with image features merged in; image_tokens.py its families whose images are tokens of a vocabulary), over
the cache layout of kv_cache.py; recurrent.py (the causal-LM step of
models with state-space layers, Mamba, Mamba2 and Bamba, whose cache holds their recurrent state); layer_repeat.py builds a deep stack's
graph from a 3- and a 4-unit trace. hf/convert.py chooses among them by task.
"""
