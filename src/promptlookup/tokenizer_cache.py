"""A GGUF's tokenizer kept in promptlookup's cache in its lean form: ``tokenizers``' own file
(``tokenizer.json``), loaded by ``transformers``' generic ``TokenizersBackend``.

A model's own tokenizer class may rebuild the tokenizer from Python copies of its vocabulary
and merges and keep them (``GemmaTokenizer``: Gemma 3's 262,144 tokens and 514,906 merges,
about 330 MiB of a process and 5 s of its start-up), and ``from_pretrained`` parses the whole
``tokenizer.json`` in Python to find the added tokens unless the config lists them. The lean
form is the same ``tokenizer.json`` with a config naming ``TokenizersBackend`` and listing the
added tokens: one parse, in Rust, and nothing kept beside it (about 100 MiB for Gemma 3).

It is written only where it is the same tokenizer (:func:`same_tokenizer`: every probe text
encodes and decodes alike, and the special tokens, padding side and chat template agree);
else the model's own class is kept.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
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
    """The lean tokenizer in ``folder``; the memory its loading freed goes back to the system
    (``tokenizers`` parses the file into temporaries twice the tokenizer's size)."""
    from transformers import TokenizersBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = TokenizersBackend.from_pretrained(str(folder), local_files_only=True)
    return_freed_memory()
    return tokenizer


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
        (tmp / "tokenizer_config.json").write_text(json.dumps(lean_config(tokenizer, own)))
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
