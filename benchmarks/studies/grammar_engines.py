"""Which grammar engine: llguidance or xgrammar, on the default model's tokenizer (49,152 tokens).

Times, for one JSON schema and one document that matches it: building the engine's view of the
tokenizer, compiling the schema, the token mask at every position of the document (what the
decoding loop pays per verified position), and llguidance's forced tokens per position. Both
engines lay JSON out the same way (", " and ": ", no other whitespace).

    pip install xgrammar apache-tvm-ffi   # xgrammar is not a dependency of promptlookup
    python benchmarks/studies/grammar_engines.py
"""

from __future__ import annotations

import json
import statistics
import time


def main() -> None:
    import llguidance
    import llguidance.hf
    import llguidance.torch as llt
    import xgrammar as xgr

    from promptlookup.grammar import JSON_LAYOUT
    from promptlookup.loading import gguf_tokenizer
    from promptlookup.models import resolve_model

    source = resolve_model(None)
    tokenizer = gguf_tokenizer(f"{source.location}/{source.gguf_file}")
    vocab = len(tokenizer)
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "emails": {"type": "array", "items": {"type": "string"}},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "age", "emails", "address"],
        "additionalProperties": False,
    }
    document = {
        "name": "Ada Lovelace",
        "age": 36,
        "emails": ["ada@example.org", "countess@lovelace.uk"],
        "address": {"city": "London", "zip": "W1 4AB"},
    }
    ids = tokenizer(json.dumps(document), add_special_tokens=False)["input_ids"]
    print(f"vocabulary {vocab}, document {len(ids)} tokens")

    def report(name, setup, compile_s, masks, extra=""):
        print(
            f"{name}: tokenizer {setup * 1e3:.0f} ms, compile {compile_s * 1e3:.1f} ms, mask "
            f"median {statistics.median(masks) * 1e6:.0f} us, mean {statistics.mean(masks) * 1e6:.0f}"
            f" us, first {masks[0] * 1e6:.0f} us{extra}"
        )

    # llguidance
    start = time.perf_counter()
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
    setup = time.perf_counter() - start
    start = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
    matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
    compile_s = time.perf_counter() - start
    bitmask, masks, forced, forced_s = llt.allocate_token_bitmask(1, vocab), [], 0, []
    for token in ids:
        start = time.perf_counter()
        llt.fill_next_token_bitmask(matcher, bitmask)
        masks.append(time.perf_counter() - start)
        start = time.perf_counter()
        forced += bool(matcher.compute_ff_tokens())
        forced_s.append(time.perf_counter() - start)
        assert matcher.consume_token(token), matcher.get_error()
    extra = (
        f"; forced tokens at {forced}/{len(ids)} positions, "
        f"{statistics.mean(forced_s) * 1e6:.0f} us each"
    )
    report("llguidance", setup, compile_s, masks, extra)

    # xgrammar
    start = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    setup = time.perf_counter() - start
    start = time.perf_counter()
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    compiled = compiler.compile_json_schema(
        json.dumps(schema), any_whitespace=False, separators=(", ", ": ")
    )
    compile_s = time.perf_counter() - start
    matcher, bitmask, masks = xgr.GrammarMatcher(compiled), xgr.allocate_token_bitmask(1, vocab), []
    for token in ids:
        start = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        masks.append(time.perf_counter() - start)
        assert matcher.accept_token(token)
    report("xgrammar", setup, compile_s, masks)


if __name__ == "__main__":
    main()
