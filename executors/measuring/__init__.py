"""The measurement loop and its load generator: load levels, ``vllm bench serve``, datasets, server counters."""
