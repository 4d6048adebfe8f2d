"""A GGUF's tokenizer kept in promptlookup's cache in its lean form: ``tokenizers``' own file
(``tokenizer.json``), loaded by ``transformers``' generic ``TokenizersBackend``.

A model's own tokenizer class may rebuild the tokenizer from Python copies of its vocabulary
and merges and keep them (``GemmaTokenizer``: Gemma 3's 262,144 tokens and 514,906 merges,
about 330 MiB of a process and 5 s of its start-up), and ``from_pretrained`` parses the whole
``tokenizer.json`` in Python to find the added tokens unless the config lists them. The lean
form is the same ``tokenizer.json`` with a config naming ``TokenizersBackend`` and listing the
added tokens: one parse, in Rust, and nothing kept beside it.

A BPE model's vocabulary and merges are kept apart from ``tokenizer.json`` (:func:`split_model`):
the tokens in id order (:data:`VOCABULARY`) and each merge as two token ids (:data:`MERGES`),
the model then built from them (:func:`bpe_model`). ``tokenizers`` parses a ``tokenizer.json``'s
model through two generic trees of it (serde's untagged enums), and the model it keeps ends up
scattered among their freed remains: for Gemma 3, 370 MiB more at the parse's peak and 113 MiB
kept after it, against 220 and 80 built from the parts (the model itself holds about 68), with
no word cache (:data:`WORD_CACHE`).

It is written only where it is the same tokenizer (:func:`same_tokenizer`: every probe text
encodes and decodes alike, and the special tokens, padding side and chat template agree);
else the model's own class is kept.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import warnings
from array import array
from pathlib import Path

from .machine import return_freed_memory
from .prompts import apply_chat_template

#: The class that loads ``tokenizer.json`` as it is.
LEAN_CLASS = "TokenizersBackend"
#: Texts on which a lean tokenizer must encode and decode as the converted one does.
PROBES = (
    "Hello world! The capital of France is",
    "  leading spaces,\n\n\ttabs and a trailing space ",
    "def area(width, height):\n    return width * height  # ½ × h\n",
    "日本語のテキスト, émigré, Ελληνικά, 🤖🎉, \u200b\u00a0zero-width and no-break",
    "<bos><eos><pad><unk><s></s><|im_start|>user\nhi<|im_end|><start_of_turn>model\n",
    "a" * 300 + " 1234567890 3.14159 -0x7f",
    "",
)
#: A split BPE model's tokens, in id order (a JSON list).
VOCABULARY = "bpe_vocabulary.json"
#: A split BPE model's merges by rank, each its two tokens' ids (int32, little-endian).
MERGES = "bpe_merges.bin"
#: The settings of a BPE model besides its vocabulary and merges.
BPE_SETTINGS = (
    "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
    "byte_fallback", "ignore_merges",
)  # fmt: skip
#: The words a split BPE model keeps the merging of (``tokenizers``' default: 10,000, each
#: word with room for all its characters' symbols, 32 bytes each): none. Gemma 3's words (its
#: text split at spaces alone) grew it by 25 MiB over the evaluation sets' 530,000 tokens,
#: tokenized no faster; SmolLM2's by 4 MiB, tokenized about 1.2x faster (a few milliseconds
#: in a 24,000-token prompt).
WORD_CACHE = 0
#: Attributes the two must share.
ATTRIBUTES = (
    "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_ids",
    "padding_side", "chat_template", "model_max_length",
)  # fmt: skip


def is_lean(folder: Path) -> bool:
    """Whether ``folder`` holds a lean tokenizer (written by :func:`save`)."""
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return config.get("tokenizer_class") == LEAN_CLASS and "added_tokens_decoder" in config


def load(folder: Path):
    """The lean tokenizer in ``folder``, its split model (if any) built from its parts; the
    memory its loading freed goes back to the system."""
    from transformers import TokenizersBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = TokenizersBackend.from_pretrained(str(folder), local_files_only=True)
    # A deep copy of the config's added tokens (Gemma 3: 6,384), kept for nothing: the
    # tokenizer's own are in Rust (``added_tokens_decoder`` and ``save_pretrained`` read them
    # there). Its objects are what keeps the loading's freed Python memory (Gemma 3: 7 MiB).
    tokenizer.init_kwargs.pop("added_tokens_decoder", None)
    if (folder / MERGES).is_file():  # the parsed model holds the added tokens alone
        backend = tokenizer.backend_tokenizer
        backend.model = bpe_model(folder, backend.model)
    return_freed_memory()
    return tokenizer


def split_model(folder: Path) -> bool:
    """Move the vocabulary and merges of the BPE model in ``folder``'s ``tokenizer.json`` to
    :data:`VOCABULARY` and :data:`MERGES`, leaving there a model of the added tokens alone
    (``tokenizers`` gives an added token the model's id for it, so the ids stay). Only where
    the ids are 0 to n - 1, every merge a pair of tokens and every added token in the
    vocabulary under its own id; returns whether it did."""
    path = folder / "tokenizer.json"
    saved = json.loads(path.read_text(encoding="utf-8"))
    model = saved.get("model") or {}
    vocabulary, merges = model.get("vocab"), model.get("merges")
    if model.get("type") != "BPE" or not isinstance(vocabulary, dict) or not merges:
        return False
    tokens = sorted(vocabulary, key=vocabulary.__getitem__)
    added = {token["content"]: token["id"] for token in saved.get("added_tokens", [])}
    if any(vocabulary[token] != index for index, token in enumerate(tokens)) or any(
        vocabulary.get(content) != index for content, index in added.items()
    ):
        return False
    if not all(isinstance(merge, list) and len(merge) == 2 for merge in merges):
        return False  # the legacy form ("a b" strings) is left as it is
    try:
        pairs = array("i", [vocabulary[token] for merge in merges for token in merge])
    except KeyError:  # a merge of a token outside the vocabulary: tokenizers refuses it
        return False
    if sys.byteorder == "big":
        pairs.byteswap()
    (folder / MERGES).write_bytes(pairs.tobytes())
    (folder / VOCABULARY).write_text(json.dumps(tokens, ensure_ascii=False), encoding="utf-8")
    model["vocab"], model["merges"] = added, []
    path.write_text(json.dumps(saved, ensure_ascii=False), encoding="utf-8")
    return True


def bpe_model(folder: Path, skeleton):
    """The BPE model split into ``folder`` (:func:`split_model`), with the settings of
    ``skeleton`` (the model left in its ``tokenizer.json``)."""
    from tokenizers.models import BPE

    with open(folder / VOCABULARY, encoding="utf-8") as file:
        tokens = json.load(file)
    pairs = array("i")
    pairs.frombytes((folder / MERGES).read_bytes())
    if sys.byteorder == "big":
        pairs.byteswap()
    merges = [(tokens[first], tokens[second]) for first, second in zip(pairs[::2], pairs[1::2])]
    settings = {name: getattr(skeleton, name) for name in BPE_SETTINGS}
    settings = {name: value for name, value in settings.items() if value is not None}
    vocabulary = {token: index for index, token in enumerate(tokens)}
    return BPE(vocabulary, merges, cache_capacity=WORD_CACHE, **settings)


def save(tokenizer, folder: Path):
    """Keep ``tokenizer`` in ``folder``: lean where that is the same tokenizer, else as its
    own class saves it. Returns the tokenizer to use: the lean one where it was kept, else
    ``tokenizer``. A read-only cache is no error (loading then only takes longer)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    except OSError:
        return tokenizer
    try:
        tokenizer.save_pretrained(str(tmp))
        own = (tmp / "tokenizer_config.json").read_text()
        whole = (tmp / "tokenizer.json").read_bytes()
        (tmp / "tokenizer_config.json").write_text(json.dumps(lean_config(tokenizer, own)))
        try:
            lean = load(tmp) if split_model(tmp) else None
        except Exception:  # noqa: BLE001 - a model not built back from its parts: kept whole
            lean = None
        if lean is None or not same_tokenizer(tokenizer, lean):  # the model whole, then
            (tmp / "tokenizer.json").write_bytes(whole)
            (tmp / MERGES).unlink(missing_ok=True)
            (tmp / VOCABULARY).unlink(missing_ok=True)
            lean = load(tmp)
        if not same_tokenizer(tokenizer, lean):
            (tmp / "tokenizer_config.json").write_text(own)
            lean = tokenizer
        tmp.rename(folder)
        return lean
    except OSError:  # another process saved it first, or no room: only costs time
        return tokenizer
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def lean_config(tokenizer, saved: str) -> dict:
    """The config of ``tokenizer``'s lean form, from the one its class saved (``saved``)."""
    config = json.loads(saved)
    config["tokenizer_class"] = LEAN_CLASS
    config["padding_side"] = tokenizer.padding_side  # a class attribute of some classes
    config["added_tokens_decoder"] = {
        str(index): token.__getstate__() for index, token in tokenizer.added_tokens_decoder.items()
    }
    return config


def same_tokenizer(expected, lean) -> bool:
    """Whether ``lean`` encodes and decodes :data:`PROBES` (and the special tokens) as
    ``expected`` does, with the same :data:`ATTRIBUTES` and chat template output."""
    texts = [*PROBES, "".join(expected.all_special_tokens) + PROBES[0]]
    for text in texts:
        for special in (True, False):
            ids = expected.encode(text, add_special_tokens=special)
            if lean.encode(text, add_special_tokens=special) != ids:
                return False
            for skip in (True, False):
                if lean.decode(ids, skip_special_tokens=skip) != expected.decode(
                    ids, skip_special_tokens=skip
                ):
                    return False
    if any(getattr(lean, name) != getattr(expected, name) for name in ATTRIBUTES):
        return False
    if len(lean) != len(expected) or lean.get_added_vocab() != expected.get_added_vocab():
        return False
    if expected.chat_template:
        messages = [{"role": "user", "content": PROBES[0]}]
        return apply_chat_template(
            lean, messages, tokenize=False, add_generation_prompt=False
        ) == apply_chat_template(expected, messages, tokenize=False, add_generation_prompt=False)
    return True
