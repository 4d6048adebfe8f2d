"""OpenAI's chat completions and completions: the request bodies (:mod:`.protocol`), their
serving (:mod:`.serving`) and the answers' bodies and chunks (:mod:`.answers`)."""
