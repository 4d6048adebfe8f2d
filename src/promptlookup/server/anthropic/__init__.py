"""Anthropic's Messages API: the request in its own shape, said as a chat request
(:mod:`.protocol`), and its answers and events (:mod:`.serving`)."""
