"""Choosing the next token: the sampler (greedy, temperature, top-k/p,
min-p, seeded draws), the logprobs rows it reports, and the structured-output
grammars that mask the logits before it draws."""
