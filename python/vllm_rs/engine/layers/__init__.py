"""The pieces the models are built from: paged attention over the KV cache
(`attention`), the RMS norms (`layernorm`), rotary position embeddings
(`rotary_embedding`) and the linear layer over GGUF blocks or half-precision
weights kept as stored (`packed_weights`)."""
