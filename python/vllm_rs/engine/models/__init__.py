"""The torch modules of the models the engine runs, one file per family:
`llama` (Llama, Mistral, Qwen2/3, Granite, SmolLM3, Phi-3), `gemma3`, `bert`
(pooling encoders) and `toy_model` (the tiny seeded decoder). Each module is
the one description of its model: the native step reads its weights."""
