"""What building a request's tool grammar costs (once per request, on the server's request
thread): CPU milliseconds of ``ToolPlan.grammar()`` for synthetic tool lists the size agents
send (23 tools of about 54 KB, as Claude Code's), in the generic format and the Hermes
template's, as built (objects closed, references checked: ``docs/structured.md``) and with
closing turned off in the same run (the ratio is what to read; CPU time, since the machine is
shared).

    python benchmarks/studies/tool_grammars.py [--tools 23] [--repeat 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time


def tools(count: int, seed: int = 0) -> list[dict]:
    """``count`` tools of eight parameters each (strings, enums, integers, booleans, arrays,
    small objects), with descriptions of agents' length."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        properties = {}
        for j in range(8):
            kind = rng.choice(["string", "integer", "boolean", "array", "object"])
            schema = {"type": kind, "description": "word " * 20}
            if kind == "array":
                schema["items"] = {"type": "string"}
            if kind == "object":
                schema["properties"] = {"x": {"type": "string"}, "y": {"type": "number"}}
            if kind == "string" and j % 3 == 0:
                schema["enum"] = ["alpha", "beta", "gamma"]
            properties[f"p{j}"] = schema
        parameters = {"type": "object", "properties": properties, "required": ["p0", "p1"]}
        out.append(
            {"name": f"tool_{i}", "description": "does something " * 60, "parameters": parameters}
        )
    return out


def cpu_ms(build, repeat: int) -> tuple[float, float]:
    """(min, median) CPU milliseconds of ``build()``, after one call to warm up."""
    build()
    times = []
    for _ in range(repeat):
        start = time.process_time()
        build()
        times.append((time.process_time() - start) * 1000)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=23)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()

    import json

    from promptlookup import grammar
    from promptlookup.server.tool_template import CLOSE_TAG, OPEN_TAG, TemplateFormat
    from promptlookup.server.tools import ToolPlan

    listed = tools(args.tools)
    print(f"{args.tools} tools, {len(json.dumps(listed)):,} characters; CPU ms, min / median")
    real = grammar.closed
    for label, template in [("generic", None), ("template", TemplateFormat(OPEN_TAG, CLOSE_TAG))]:
        plan = ToolPlan(listed, "auto", True, template)
        closed_ms = cpu_ms(plan.grammar, args.repeat)
        grammar.closed = lambda schema: schema  # objects left open, as before closing
        try:
            open_ms = cpu_ms(plan.grammar, args.repeat)
        finally:
            grammar.closed = real
        print(
            f"{label:9} closed {closed_ms[0]:6.1f} / {closed_ms[1]:6.1f}   "
            f"open {open_ms[0]:6.1f} / {open_ms[1]:6.1f}   "
            f"ratio (medians) {closed_ms[1] / open_ms[1]:.2f}"
        )


if __name__ == "__main__":
    main()
