"""How a model is found and loaded: which model `--model` names (`registry`),
its checkpoint's configuration (`checkpoint`, `bert_config`, `gguf_file`,
`pooler_config`) and its weights read into the torch modules (`weights`).
Everything but `weights` stays free of torch, so `serve` can validate a
model before starting anything."""
