"""The HTTP server only: the OpenAI-compatible app, its request models, the continuous-batching engine and scheduler,
and metrics. It calls torch2jax.generate for everything about generating text; it never copies it."""
