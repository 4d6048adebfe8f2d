"""The agents' conformance check (``make test-agents``): Claude Code, Codex, Qwen Code and
opencode, installed from npm into a local folder, each run non-interactively on a small task
in a scratch repository against ``promptlookup serve`` (and optionally llama-server), through a
recording proxy that keeps each request's status, timing, usage and tool calls but none of the
bodies' text. docs/agents.md says how to run it and how to read its report."""
