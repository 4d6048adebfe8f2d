"""promptlookup's drafting inside vLLM: a proposer for ``speculative_config={"method":
"custom_class", "model": "promptlookup.vllm.PromptLookupProposer", ...}``.

vLLM (0.32) builds the class with its ``VllmConfig`` in each worker and, after every engine
step, calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)``:
row ``i`` of the batch holds ``token_ids_cpu[i, :num_tokens_no_spec[i]]`` (prompt and output so
far, the tokens just sampled included) and ``sampled_token_ids[i]`` the tokens this step added
(empty while a prompt is still being prefilled). The answer is one draft per row, of any length
up to ``num_speculative_tokens``; vLLM verifies them in the next step's forward pass.

Each step:

1. Rows are matched to requests (:class:`~.requests.RequestTable`), by request id when the
   caller is vLLM's model runner (read from its input batch), else by content.
2. What vLLM kept of each request's last draft (``len(sampled) - 1`` tokens) is recorded as
   acceptance, and the time since the last call, the cost of the step that verified those
   drafts, as a pass over ``batch size + drafted`` tokens at that batch size (steps that also
   prefilled a prompt are not timed).
3. Each request's suffix automaton is extended by its new tokens and drafts the continuation
   of its longest earlier match; a request whose ``SamplingParams.extra_args`` carry a
   ``prediction`` (text, or token ids) also drafts from it, as ``promptlookup serve`` does.
4. The cost-aware policy (:meth:`~promptlookup.policy.SpeculationPolicy.decide`)
   cuts the drafts to the lengths worth verifying in one pass over all rows: 0 for all when
   drafting does not pay (open-ended text), long drafts on trusted matches.
   In a pass over several requests that joined the batch together, the bottleneck rule
   (:mod:`.batch_policy`) counts only the drafts of the requests that set the batch's length
   (and of those with a prediction): the batch lasts as long as its slowest request.

Nothing here imports vLLM: the class reads the config's attributes only.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import weakref
from collections import OrderedDict

from ..drafters.prompt_lookup import PromptLookupDrafter
from ..policy import NO_POLICY, SequenceDraft, SpeculationPolicy
from ..text import eos_token_ids
from . import batch_policy
from .batch_policy import RowPace
from .requests import RequestState, RequestTable

#: Under vLLM's logger, so that its handlers (the server's log) show these lines.
logger = logging.getLogger("vllm.promptlookup")

#: Relative cost of a pass over n tokens assumed before any is measured (a pass over 16 tokens
#: about 1.5 passes over one): optimistic enough to try drafting, replaced by measured passes.
PRIOR_SHAPE = {1: 1.0, 2: 1.05, 4: 1.12, 8: 1.25, 16: 1.5, 32: 2.0, 64: 3.0}
#: The ``extra_args`` key (``vllm_xargs`` in a request to vLLM's OpenAI server) of a prediction.
PREDICTION_KEY = "prediction"
#: Counts of the last requests that left, by request id (see :meth:`request_stats`).
KEEP_STATS = 256

#: The environment variable that chooses the rule for passes over several requests:
#: ``bottleneck`` (the default: :mod:`.batch_policy`) or ``throughput`` (the policy's own).
BATCH_RULE_ENV = "PROMPTLOOKUP_VLLM_BATCH_RULE"
BATCH_RULES = ("bottleneck", "throughput")

#: The live proposers of this process (tests and tools find the engine's one here).
INSTANCES: weakref.WeakSet = weakref.WeakSet()


class PromptLookupProposer:
    """Drafts for vLLM's running requests with promptlookup's suffix automaton and policy.

    Args:
        vllm_config: vLLM's ``VllmConfig``; read: ``speculative_config.num_speculative_tokens``
            (the longest draft), ``model_config.max_model_len``, the model's end-of-sequence
            ids and its tokenizer (for predictions given as text).
        min_match, max_match: suffix lengths the automaton matches (as in promptlookup).
        adaptive: False verifies whole drafts (every draft token the automaton finds).
        batch_rule: ``"bottleneck"`` (:mod:`.batch_policy`: in a pass over several requests,
            drafts only for the requests that set the batch's length, and for those with a
            prediction) or ``"throughput"`` (the policy's tokens per second over all rows);
            default: the environment's ``PROMPTLOOKUP_VLLM_BATCH_RULE``, else bottleneck.
    """

    def __init__(
        self,
        vllm_config,
        min_match: int = 1,
        max_match: int = 64,
        adaptive: bool = True,
        batch_rule: str | None = None,
    ) -> None:
        spec = vllm_config.speculative_config
        model = vllm_config.model_config
        self.max_draft = max(1, int(spec.num_speculative_tokens or 1))
        self.max_model_len = int(model.max_model_len)
        self.min_match, self.max_match = min_match, max_match
        config = getattr(model, "hf_text_config", None) or getattr(model, "hf_config", None)
        self.eos_token_ids = eos_token_ids(getattr(config, "eos_token_id", None))
        self._tokenizer_name = getattr(model, "tokenizer", None) or getattr(model, "model", None)
        self._trust_remote_code = bool(getattr(model, "trust_remote_code", False))
        self._tokenizer = None
        self.batch_rule = batch_rule or os.environ.get(BATCH_RULE_ENV) or "bottleneck"
        if self.batch_rule not in BATCH_RULES:
            raise ValueError(f"batch_rule must be one of {BATCH_RULES}, got {self.batch_rule!r}")
        #: The bottleneck rule's parameters (:func:`.batch_policy.bottleneck_weights`).
        self.slack, self.others = batch_policy.SLACK, batch_policy.OTHERS
        self.scale = batch_policy.SCALE
        #: The policy (NO_POLICY when not adaptive: whole drafts), its costs starting from
        #: PRIOR_SHAPE, then learning from the engine's steps.
        self.policy = SpeculationPolicy() if adaptive else NO_POLICY
        self.policy.record_calibration(
            0, [(size, relative * 0.01, 0.01) for size, relative in PRIOR_SHAPE.items()]
        )
        self.table = RequestTable(self._new_state)
        self.finished: OrderedDict[str, dict] = OrderedDict()
        self._last_call: float | None = None
        self._runner = None
        self.steps = self.timed_steps = 0
        #: The clock that times engine steps (tests replace it).
        self.clock = time.perf_counter
        INSTANCES.add(self)

    def load_model(self, *args, **kwargs) -> None:
        """vLLM's hook for proposers with weights, called once at start-up: no weights, but
        the tokenizer that predictions given as text need is loaded here, not inside the
        engine step of the first request with a prediction (where it stalled every running
        request; a failure here only leaves it to that step)."""
        try:
            self._tokenizer_of()
        except Exception as exc:  # e.g. a model without a Hugging Face tokenizer
            logger.warning("tokenizer not loaded at start-up (%s); loading it on first use", exc)

    # -- one engine step ---------------------------------------------------------------------

    def propose(
        self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None
    ) -> list[list[int]]:
        """One draft (a list of token ids, maybe empty) per row of the batch."""
        now = self.clock()
        rows = len(sampled_token_ids)
        runner = self._find_runner()
        req_ids = list(runner.input_batch.req_ids[:rows]) if runner is not None else None
        self._retire(req_ids)
        assigned = self.table.assign(rows, num_tokens_no_spec, token_ids_cpu, req_ids)
        self._observe(assigned, sampled_token_ids, now)
        drafts: list[list[int]] = [[] for _ in range(rows)]
        entries, ready = [], []
        for i, (state, _) in enumerate(assigned):
            state.last_draft, state.last_match = [], None
            room = self.max_model_len - len(state.tokens) - 1
            if not sampled_token_ids[i] or room < 1:
                continue  # prefilling, or at the length limit: no draft
            draft = state.drafter.propose(state.tokens, min(self.max_draft, room))
            entries.append(
                SequenceDraft(len(draft), draft.match_length, state.acceptance, state.sampling)
            )
            ready.append((i, state, draft))
        lengths = self._draft_lengths(entries, [state for _, state, _ in ready])
        for (i, state, draft), length in zip(ready, lengths):
            state.last_draft = list(draft[:length])
            state.last_match = draft.match_length
            state.drafted += length
            drafts[i] = state.last_draft
        self.steps += 1
        self._last_call = self.clock()
        return drafts

    def _draft_lengths(self, entries: list[SequenceDraft], states: list[RequestState]):
        """The policy's lengths, through the bottleneck rule when it is on."""
        if (
            self.batch_rule == "throughput"
            or len(entries) < 2
            or not batch_policy.one_cohort([state.first_step for state in self.table.rows])
        ):
            return self.policy.decide(entries)
        paces = [
            RowPace(
                state.remaining(self.max_model_len),
                state.produced(),
                state.steps,
                state.reference_tokens > 0,
            )
            for state in states
        ]
        weights = batch_policy.bottleneck_weights(paces, self.slack, self.others, self.scale)
        return self.policy.decide(entries, weights=weights)

    def _observe(self, assigned, sampled_token_ids, now: float) -> None:
        """Record what vLLM kept of each row's last draft, and the step's cost."""
        timed, batch, tokens = self._last_call is not None, 0, 0
        for (state, new), sampled in zip(assigned, sampled_token_ids):
            if new or not sampled:
                timed = False  # a prompt's prefill shared the step
                continue
            state.steps += 1
            batch += 1
            draft, kept = state.last_draft, len(sampled) - 1
            verified = len(draft)
            if kept < verified and sampled[kept] == draft[kept]:
                verified = kept  # vLLM scheduled only part of the draft
            tokens += 1 + verified
            if verified:
                state.accepted += min(kept, verified)
                entry = SequenceDraft(verified, state.last_match, state.acceptance, state.sampling)
                self.policy.learn(entry, min(kept, verified))
        if timed and batch:
            self.policy.record_forward(tokens, now - self._last_call, batch_size=batch)
            self.timed_steps += 1

    # -- requests ----------------------------------------------------------------------------

    def _new_state(self, key: str | None, row, length: int) -> RequestState:
        """The state of a request seen for the first time (its prediction, when it has one,
        indexed before its tokens)."""
        params = self._sampling_params(key)
        reference = self._prediction_ids(params)
        drafter = PromptLookupDrafter(
            num_tokens=self.max_draft,
            min_match=self.min_match,
            max_match=self.max_match,
            eos_token_ids=self.eos_token_ids,
            reference_ids=reference,
        )
        sampling = params is not None and float(getattr(params, "temperature", 0) or 0) > 0
        if reference:
            logger.info("request %s drafts from a prediction of %d tokens", key, len(reference))
        cached = self._cached_request(key)
        prompt = getattr(cached, "num_prompt_tokens", None)
        limit = getattr(params, "max_tokens", None)
        return RequestState(
            drafter,
            key=key,
            sampling=sampling,
            reference_tokens=len(reference),
            prompt_tokens=prompt if isinstance(prompt, int) else None,
            max_tokens=limit if isinstance(limit, int) else None,
            first_step=self.steps,
        )

    def _retire(self, req_ids) -> None:
        """Keep the counts of requests that left the batch (by id) for :meth:`request_stats`."""
        if req_ids is None:
            return
        present = set(req_ids)
        for state in self.table.rows:
            if state is not None and state.key is not None and state.key not in present:
                self.finished[state.key] = self._stats_of(state)
        while len(self.finished) > KEEP_STATS:
            self.finished.popitem(last=False)

    def request_stats(self, req_id: str) -> dict | None:
        """``drafted``, ``accepted``, ``steps`` and ``reference_tokens`` of a running or
        recently ended request (None when unknown, e.g. without request ids)."""
        for state in self.table.rows:
            if state is not None and state.key == req_id:
                return self._stats_of(state)
        return self.finished.get(req_id)

    @staticmethod
    def _stats_of(state: RequestState) -> dict:
        return {
            "drafted": state.drafted,
            "accepted": state.accepted,
            "steps": state.steps,
            "reference_tokens": state.reference_tokens,
        }

    def _find_runner(self):
        """vLLM's model runner, when it is the caller (its input batch names the rows'
        requests and its requests carry their sampling parameters); None otherwise."""
        if self._runner is not None:
            return self._runner
        frame = sys._getframe(2)
        for _ in range(3):
            if frame is None:
                break
            candidate = frame.f_locals.get("self")
            if hasattr(candidate, "input_batch") and hasattr(candidate, "requests"):
                self._runner = candidate
                return candidate
            frame = frame.f_back
        return None

    def _cached_request(self, key: str | None):
        """vLLM's record of the request (its prompt, sampling parameters), when known."""
        if key is None or self._runner is None:
            return None
        return self._runner.requests.get(key)

    def _sampling_params(self, key: str | None):
        return getattr(self._cached_request(key), "sampling_params", None)

    def _prediction_ids(self, params) -> list[int]:
        """The request's prediction as token ids: ``extra_args["prediction"]`` as text
        (tokenized with the model's tokenizer) or as a list of ids."""
        extra = getattr(params, "extra_args", None) or {}
        prediction = extra.get(PREDICTION_KEY)
        if not prediction:
            return []
        if isinstance(prediction, list) and all(isinstance(t, int) for t in prediction):
            return list(prediction)
        if not isinstance(prediction, str):
            logger.warning("ignoring a prediction that is neither text nor token ids")
            return []
        return list(self._tokenizer_of()(prediction, add_special_tokens=False)["input_ids"])

    def _tokenizer_of(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(
                self._tokenizer_name, trust_remote_code=self._trust_remote_code
            )
        return self._tokenizer
