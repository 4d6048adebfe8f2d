"""The ranges sampling settings are taken in, torch-free so that the server's request models
check the same numbers as :class:`~promptlookup.sampling.SamplingParams`: beyond them, dividing
or multiplying the logits leaves float32's range (inf, then NaN probabilities)."""

#: The smallest temperature above 0 (greedy) that sampling takes.
MIN_TEMPERATURE = 1e-4
#: Repetition penalties taken (1.0: off).
REPETITION_PENALTY_RANGE = (0.01, 100.0)
