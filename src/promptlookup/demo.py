"""``make demo``: a code-editing request about one of promptlookup's own source files, answered by
the default model with prompt lookup (streamed), then by plain decoding, with both speeds."""

from __future__ import annotations

import inspect
import sys

import promptlookup
from promptlookup import text as text_module
from promptlookup.bench.agreed import agreed_length

MAX_NEW_TOKENS = 200


def build_request() -> str:
    source = inspect.getsource(text_module.IncrementalDetokenizer)
    return (
        "Here is a Python class from my project:\n\n```python\n" + source + "```\n\n"
        "Rename the attribute `_read_offset` to `_emitted_offset` everywhere. Reply with the "
        "complete updated class in a Python code block."
    )


def main() -> None:
    print(
        "Loading the default model (SmolLM2-135M-Instruct; the first run converts its GGUF "
        "file once, ~20 s)...",
        file=sys.stderr,
    )
    lm = promptlookup.load_model()
    print(
        "Measuring this machine's forward-pass costs (the first run only: up to ~30 s)...",
        file=sys.stderr,
    )
    lm.warm_up()
    request = build_request()
    print(f"\n### Request\n{request}\n\n### Answer (streamed, prompt lookup)\n", flush=True)
    stream = lm.stream(request, chat=True, max_new_tokens=MAX_NEW_TOKENS)
    for piece in stream:
        print(piece, end="", flush=True)
    fast = stream.result
    print("\n\n### Plain decoding of the same request (not shown)...", flush=True)
    plain = lm.generate(request, chat=True, max_new_tokens=MAX_NEW_TOKENS, drafter="none")
    fs, ps = fast.stats, plain.stats
    print(
        f"\nprompt lookup : {fs.new_tokens} tokens in {fs.seconds:.2f} s = "
        f"{fs.tokens_per_second:.1f} tokens/s, {fs.tokens_per_forward:.2f} tokens per forward pass"
    )
    print(
        f"plain decoding: {ps.new_tokens} tokens in {ps.seconds:.2f} s = "
        f"{ps.tokens_per_second:.1f} tokens/s, 1.00 tokens per forward pass"
    )
    speedup = fs.tokens_per_second / ps.tokens_per_second if ps.tokens_per_second else float("nan")
    print(f"speed-up: {speedup:.2f}x; outputs {compare(lm, fast, plain)}")


def compare(lm, fast, plain) -> str:
    """``identical``, or where the two outputs part and the two tokens' logits there (from a
    one-token pass after the common prefix: a near-tie where passes are not row-invariant)."""
    if fast.token_ids == plain.token_ids:
        return "identical"
    position = agreed_length([fast.token_ids, plain.token_ids])
    if position >= min(len(fast.token_ids), len(plain.token_ids)):
        return f"different: one output stops at token {position}, the other goes on"
    target = lm.target
    target.reset()
    context = [*plain.prompt_ids, *plain.token_ids[:position]]
    target.prefill(context[:-1])
    logits = target.forward(context[-1:])[0]
    ours, theirs = fast.token_ids[position], plain.token_ids[position]
    invariant = getattr(target, "row_invariant", False)
    return (
        f"different from new token {position} on: prompt lookup chose {ours} (logit "
        f"{logits[ours].item():.6f}), plain decoding {theirs} (logit {logits[theirs].item():.6f})"
        + (
            ""
            if invariant
            else "; this model's passes are not row-invariant, so a near-tie can part them"
        )
    )


if __name__ == "__main__":
    main()
