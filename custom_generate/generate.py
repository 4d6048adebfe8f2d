"""promptlookup as a ``transformers`` custom_generate repository folder.

    model.generate(input_ids, custom_generate="<path to the promptlookup repository>",
                   trust_remote_code=True, max_new_tokens=256)

``transformers`` calls :func:`generate` with every argument of ``model.generate`` (plus
``model``); it delegates to the installed package (``pip install promptlookup``), so this file
holds no logic. Extra arguments: ``drafter`` (default ``"prompt-lookup"``) and
``drafter_options`` (a dict, e.g. ``{"num_tokens": 8}``).
"""

import promptlookup.hf_generate


def generate(*args, model, **kwargs):
    # ``*args``: a model loaded with trust_remote_code has ``model.generate`` replaced by
    # ``functools.partial(generate, model=model)``, so the prompt may arrive positionally.
    return promptlookup.hf_generate.generate(model, *args, **kwargs)
