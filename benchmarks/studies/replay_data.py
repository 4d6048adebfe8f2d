"""The greedy outputs of a ``promptlookup bench`` run, as token ids, for the replay studies
(``draft_headroom.py``, ``policy_replay.py``)."""

from __future__ import annotations

import json
from pathlib import Path


def plain_outputs(run: Path, data_files: list[str], every: int = 1):
    """``(tokenizer, [(task, prompt ids, output ids), ...])`` for every ``every``-th ``plain``
    row of ``run``: the prompt through the default model's chat template, the output's own token
    ids when the run kept them (0.6.3 on), else its re-tokenised text."""
    from promptlookup.models import load_pretrained  # heavy imports only when run

    _, tokenizer, _ = load_pretrained(None)  # the default model's tokenizer
    rows = {}
    for path in data_files:
        for line in open(path):
            row = json.loads(line)
            rows[row["id"]] = row
    results = [json.loads(line) for line in open(Path(run) / "results.jsonl")]
    results = [r for r in results if r["method"] == "plain" and r["id"] in rows][::every]
    outputs = []
    for result in results:
        prompt = tokenizer.apply_chat_template(
            rows[result["id"]]["messages"], add_generation_prompt=True, tokenize=True
        )
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        output = (
            result.get("token_ids")
            or tokenizer(result["text"], add_special_tokens=False)["input_ids"]
        )
        outputs.append((result["task"], prompt, list(output)))
    return tokenizer, outputs
