"""Running vLLM: platforms, command lines, plugins, model folders, what the real-vLLM executors share."""
