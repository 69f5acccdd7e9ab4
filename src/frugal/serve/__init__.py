"""Serving: what it costs to serve a model, the cheapest way to serve it, and when an API
is cheaper (inference memory, throughput, latency, dollars per token, TCO)."""
