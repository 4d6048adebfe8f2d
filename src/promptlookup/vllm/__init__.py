"""promptlookup inside vLLM: its drafting as a vLLM speculative proposer, and OpenAI's
predicted outputs for vLLM's OpenAI server.

- :class:`PromptLookupProposer`: pass ``speculative_config={"method": "custom_class", "model":
  "promptlookup.vllm.PromptLookupProposer", "num_speculative_tokens": 16}`` to vLLM (its ``LLM``
  or its server's ``--speculative-config``); see :mod:`.proposer`.
- :class:`PredictedOutputs`: an ASGI middleware for vLLM's server (``--middleware
  promptlookup.vllm.PredictedOutputs``) that hands a request's ``prediction`` to the proposer.
- ``promptlookup vllm-serve MODEL [vLLM's flags]`` starts vLLM's server with both.

Importing this package does not import vLLM (nor torch): vLLM imports it.
"""

from .middleware import PredictedOutputs, prediction_text
from .proposer import PREDICTION_KEY, PromptLookupProposer

__all__ = ["PREDICTION_KEY", "PredictedOutputs", "PromptLookupProposer", "prediction_text"]
